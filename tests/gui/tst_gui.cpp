// The desktop app under QT_QPA_PLATFORM=offscreen: open a capture, wait for the analysis,
// switch views, click a cell and check the drill-down against the engine's own numbers,
// export a PNG and find the markers in its pixels; every item model through
// QAbstractItemModelTester.

#include "analysis/analyzer.h"
#include "gui/head_table_model.h"
#include "widgets/heatmap_view.h"
#include "gui/main_window.h"
#include "synth/synthetic_capture.h"
#include "gui/worst_cells_model.h"

#include <QAbstractItemModelTester>
#include <QApplication>
#include <QFile>
#include <QImage>
#include <QSignalSpy>
#include <QStandardPaths>
#include <QTemporaryDir>
#include <QTest>

#include <cmath>

using namespace kvscope;

class TestGui : public QObject {
    Q_OBJECT

private slots:
    void initTestCase();
    void modelsPassTheTester();
    void opensAndAnalysesInTheBackground();
    void heatmapShowsTheEngineNumbers();
    void clickOpensTheDrillDown();
    void arrowKeysMoveTheSelection();
    void exportedPngHasTheMarkers();
    void brokenBundleIsAMessageNotACrash();
    void closingWhileSeveralRunsAnalyseIsSafe();

private:
    void openDemo();
    QTemporaryDir m_dir;
    QString m_path;
    std::shared_ptr<BundleReader> m_reader;
    AnalysisResult m_reference;  // computed here, without the GUI
    std::unique_ptr<MainWindow> m_window;
};

void TestGui::initTestCase()
{
    QStandardPaths::setTestModeEnabled(true);  // recent files go to a test location
    m_path = m_dir.filePath("demo.h5");
    writeSyntheticCapture(m_path.toStdString(), demoCaptureOptions());
    m_reader = std::make_shared<BundleReader>(m_path.toStdString());
    m_reference = analyzeBundle(m_reader);
    m_window = std::make_unique<MainWindow>();
    m_window->resize(1400, 900);
    m_window->show();
    QVERIFY(QTest::qWaitForWindowExposed(m_window.get()));
}

void TestGui::openDemo()
{
    QSignalSpy finished(&m_window->controller(), &AnalysisController::finished);
    m_window->openPath(m_path);
    QVERIFY(finished.wait(60000));
}

void TestGui::modelsPassTheTester()
{
    auto result = std::make_shared<const AnalysisResult>(m_reference);
    HeadTableModel heads;
    QAbstractItemModelTester headTester(&heads, QAbstractItemModelTester::FailureReportingMode::QtTest);
    heads.setCell(result, 0, 5, 50);
    QCOMPARE(heads.rowCount(), 4);
    heads.setCell(result, 1, 2, 3);
    heads.clear();
    QCOMPARE(heads.rowCount(), 0);
    WorstCellsModel worst;
    QAbstractItemModelTester worstTester(&worst, QAbstractItemModelTester::FailureReportingMode::QtTest);
    worst.setCells(&m_reference.prompts[0], worstCells(m_reference.prompts[0], 20));
    QCOMPARE(worst.rowCount(), 20);
    worst.setCells(nullptr, {});
    QCOMPARE(worst.rowCount(), 0);
}

void TestGui::opensAndAnalysesInTheBackground()
{
    QSignalSpy layers(&m_window->controller(), &AnalysisController::layerFinished);
    QSignalSpy opened(&m_window->controller(), &AnalysisController::opened);
    openDemo();
    QCOMPARE(opened.count(), 1);
    QCOMPARE(layers.count(), 8);  // the heatmap filled in layer by layer
    QVERIFY(m_window->controller().result());
}

void TestGui::heatmapShowsTheEngineNumbers()
{
    for (int prompt : {0, 1})
        for (HeatmapMetric metric : {HeatmapMetric::RelLinf, HeatmapMetric::ErrorRatio, HeatmapMetric::Bc,
                                     HeatmapMetric::BcVsNoise})
            for (KvPart part : {KvPart::K, KvPart::V}) {
                m_window->setPrompt(prompt);
                m_window->setMetric(metric);
                m_window->setPart(part);
                const PromptAnalysis& p = m_reference.prompts[std::size_t(prompt)];
                QTRY_COMPARE(m_window->heatmap().grid().columns, p.tokens);  // few tokens: no pooling
                const HeatmapGrid& shown = m_window->heatmap().grid();
                QCOMPARE(shown.rows, 8);
                HeatmapSpec spec;
                spec.metric = metric;
                spec.part = part;
                for (int l = 0; l < 8; ++l)
                    for (std::int64_t t = 0; t < p.tokens; ++t) {
                        const float expect = heatmapValue(p, spec, l, t);
                        const float got = shown.at(l, t);
                        QVERIFY2(std::isnan(expect) ? std::isnan(got) : got == expect,
                                 qPrintable(QString("prompt %1 layer %2 token %3: %4 vs %5").arg(prompt).arg(l).arg(t).arg(got).arg(expect)));
                    }
            }
}

void TestGui::clickOpensTheDrillDown()
{
    m_window->setPrompt(0);
    m_window->setMetric(HeatmapMetric::ErrorRatio);
    m_window->setPart(KvPart::K);
    HeatmapView& view = m_window->heatmap();
    view.resetView(m_reference.prompts[0].tokens, 8);
    view.replot(QCustomPlot::rpImmediateRefresh);
    const int layer = 5;
    const qint64 token = 50;  // the fault: layer 5, head 1, from token 46
    const QPoint at(int(view.xAxis->coordToPixel(double(token))), int(view.yAxis->coordToPixel(layer)));
    QTest::mouseClick(&view, Qt::LeftButton, {}, at);
    QCOMPARE(m_window->selectedLayer(), layer);
    QCOMPARE(m_window->selectedToken(), token);
    const PromptAnalysis& p = m_reference.prompts[0];
    HeadTableModel& table = m_window->headTable();
    QCOMPARE(table.rowCount(), p.heads);
    for (int h = 0; h < p.heads; ++h) {
        QCOMPARE(table.value(h, 1), double(p.value(Metric::KLinf, layer, token, h)));
        QCOMPARE(table.value(h, 2), double(p.value(Metric::BaseKLinf, layer, token, h)));
        QCOMPARE(table.value(h, 6), double(p.value(Metric::KCos, layer, token, h)));
        QCOMPARE(table.value(h, 10), double(p.value(Metric::VL2, layer, token, h)));
    }
    // The faulty head stands out in the table as in the data.
    QVERIFY(table.value(1, 3) > 20);
    QSignalSpy histogram(m_window.get(), &MainWindow::histogramShown);
    QVERIFY(histogram.wait(20000) || histogram.count() > 0);
}

void TestGui::arrowKeysMoveTheSelection()
{
    m_window->selectCell(3, 20);
    QTest::keyClick(m_window.get(), Qt::Key_Right);
    QCOMPARE(m_window->selectedToken(), qint64(21));
    QTest::keyClick(m_window.get(), Qt::Key_Down);
    QCOMPARE(m_window->selectedLayer(), 4);
}

void TestGui::exportedPngHasTheMarkers()
{
    m_window->setPrompt(0);
    m_window->setMetric(HeatmapMetric::RelLinf);
    HeatmapView& view = m_window->heatmap();
    view.resetView(m_reference.prompts[0].tokens, 8);
    view.replot(QCustomPlot::rpImmediateRefresh);
    const QString png = m_dir.filePath("view.png");
    QVERIFY(m_window->exportView(png));
    QVERIFY(m_window->exportView(m_dir.filePath("view.pdf")));
    QVERIFY(m_window->exportView(m_dir.filePath("view.svg")));
    QVERIFY(QFile(m_dir.filePath("view.svg")).size() > 1000);
    const QImage image(png);
    QCOMPARE(image.width(), view.width() * 2);  // exported at twice the screen resolution
    const PromptAnalysis& p = m_reference.prompts[0];
    const QRect rect = view.axisRect()->rect();
    auto columnHas = [&](double token, auto&& isColour) {
        const int x = int(std::round(view.xAxis->coordToPixel(token) * 2));
        for (int y = rect.top() * 2 + 4; y < rect.bottom() * 2 - 4; ++y)
            for (int dx = -2; dx <= 2; ++dx)
                if (isColour(QColor(image.pixel(x + dx, y))))
                    return true;
        return false;
    };
    auto red = [](const QColor& c) { return c.red() > 190 && c.green() < 40 && c.blue() < 40; };
    auto orange = [](const QColor& c) { return c.red() > 230 && c.green() > 110 && c.green() < 170 && c.blue() < 40; };
    QVERIFY2(columnHas(double(p.promptLen) - 0.5, red), "no red prefill/decode line");
    QVERIFY2(columnHas(double(p.divergences.at(0).position), orange), "no orange divergence line");
    // And not everywhere: a column well inside the prefill has neither.
    QVERIFY(!columnHas(10.0, orange));
}

void TestGui::brokenBundleIsAMessageNotACrash()
{
    const QString broken = m_dir.filePath("broken.h5");
    QFile::copy(m_path, broken);
    QFile(broken).resize(QFile(broken).size() / 3);
    QSignalSpy failed(&m_window->controller(), &AnalysisController::failed);
    m_window->openPath(broken);
    QVERIFY(failed.wait(20000));
    QVERIFY2(failed.first().first().toString().contains(broken), qPrintable(failed.first().first().toString()));
}

void TestGui::closingWhileSeveralRunsAnalyseIsSafe()
{
    // Each open() cancels the run before it, which may still be reading a layer and posting
    // to the controller: closing the window must wait for all of them, not only the latest.
    for (int round = 0; round < 3; ++round) {
        auto window = std::make_unique<MainWindow>();
        for (int i = 0; i < 4; ++i)
            window->openPath(m_path);
        QCoreApplication::processEvents();
        window.reset();
        QCoreApplication::processEvents();  // anything a stale run posted would run now
    }
}

QTEST_MAIN(TestGui)
#include "tst_gui.moc"
