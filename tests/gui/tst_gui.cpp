// The desktop app under QT_QPA_PLATFORM=offscreen: open a capture, wait for the analysis,
// switch views, click a cell and check the drill-down against the engine's own numbers,
// export a PNG and find the markers in its pixels; every item model through
// QAbstractItemModelTester.

#include "analysis/analyzer.h"
#include "format/bundle_reader.h"
#include "gui/head_table_model.h"
#include "widgets/heatmap_view.h"
#include "gui/main_window.h"
#include "synth/synthetic_capture.h"
#include "gui/worst_cells_model.h"

#include "gui/across_prompts_page.h"
#include "gui/drill_down_panel.h"
#include "gui/prompt_page.h"
#include "gui/recent_files_menu.h"
#include "widgets/histogram_view.h"
#include "widgets/token_line_view.h"

#include <QAbstractItemModelTester>
#include <QComboBox>
#include <QHeaderView>
#include <QListWidget>
#include <QRegularExpression>
#include <QScrollBar>
#include <QSettings>
#include <QTableView>
#include <QTabWidget>
#include <QWheelEvent>
#include <QApplication>
#include <QDir>
#include <QElapsedTimer>
#include <QFile>
#include <QImage>
#include <QSignalSpy>
#include <QStandardPaths>
#include <QTemporaryDir>
#include <QTest>

#include <atomic>
#include <future>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstring>

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
    // The usability issue, point by point.
    void emptyStateSaysWhatToDo();
    void oneRatioInEveryView();
    void panelsFollowThePromptAndKeepTheHead();
    void failedOpenLeavesNothingStale();
    void histogramAxesFitTheData();
    void zoomStaysInTheDataAndResets();
    void dragPansWithoutSelecting();
    void keyboardReachesEveryPanel();
    void layoutFitsAt1280x800AndIsRemembered();
    void colourRangeComesFromTheData();
    void acrossPromptsLeadsToThePrompt();
    void linePlotShowsAllItsData();
    void cancelKeepsWhatWasAnalysed();
    void tooltipUsesTokenTextAndDivergenceBounds();
    void twoWayCaptureRanksByError();
    void suspectsLeadToTheBug();
    void bundleTruncatedOrReplacedWhileOpen();
    void importCanBeCancelledAndClosed();
    void secondBundleWhileTheFirstAnalyses();
    void hdf5CrashIsAMessage();

private:
    void openDemo();
    void ensureDemoOpen();
    QTemporaryDir m_dir;
    QString m_path;
    std::shared_ptr<BundleReader> m_reader;
    AnalysisResult m_reference;  // computed here, without the GUI
    std::unique_ptr<MainWindow> m_window;
};

void TestGui::initTestCase()
{
    QStandardPaths::setTestModeEnabled(true);  // recent files go to a test location
    QSettings().clear();                       // and start empty: no layout of an earlier run
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

void TestGui::ensureDemoOpen()
{
    if (m_window->controller().path() != m_path || !m_window->controller().result() || m_window->controller().isRunning())
        openDemo();
    m_window->showAcrossPrompts(false);
    m_window->setPrompt(0);
    m_window->activateWindow();  // window shortcuts need the active window
    QVERIFY(QTest::qWaitForWindowActive(m_window.get()));
}

// The cell ratio computed here from the stored per-head errors: the largest actual L-inf
// over heads divided by the largest base L-inf over heads (analysis_result.h).
static double referenceRatio(const PromptAnalysis& p, KvPart part, int layer, qint64 token, int* worstHead = nullptr)
{
    const Metric actual = part == KvPart::K ? Metric::KLinf : Metric::VLinf;
    const Metric base = part == KvPart::K ? Metric::BaseKLinf : Metric::BaseVLinf;
    double a = -1, b = -1;
    for (int h = 0; h < p.heads; ++h) {
        const double va = p.value(actual, layer, token, h), vb = p.value(base, layer, token, h);
        if (!std::isnan(va) && va > a) {
            a = va;
            if (worstHead)
                *worstHead = h;
        }
        if (!std::isnan(vb))
            b = std::max(b, vb);
    }
    return a < 0 || b < 0 ? std::nan("") : a / std::max(b, 1e-10);
}

// The number after `label` in rich text: "<b>2.345</b>" or plain.
static double numberAfter(const QString& text, const QString& label)
{
    const int at = text.indexOf(label);
    if (at < 0)
        return std::nan("");
    QString rest = text.mid(at + label.size());
    rest.remove(QRegularExpression("<[^>]*>"));
    const QRegularExpressionMatch m = QRegularExpression(R"(^\s*([-+0-9.eE]+))").match(rest);
    return m.hasMatch() ? m.captured(1).toDouble() : std::nan("");
}

// The 99th percentile (nearest rank) over the (layer, token) cells of the largest value of `m`
// over heads.
static double percentile99OfCellMaxima(const PromptAnalysis& p, Metric m)
{
    std::vector<double> values;
    for (int l = 0; l < int(p.layers.size()); ++l)
        for (qint64 t = 0; t < p.tokens; ++t) {
            double largest = -1;
            for (int h = 0; h < p.heads; ++h)
                if (!std::isnan(p.value(m, l, t, h)))
                    largest = std::max(largest, double(p.value(m, l, t, h)));
            if (largest >= 0)
                values.push_back(largest);
        }
    std::sort(values.begin(), values.end());
    return values[std::min(values.size() - 1, std::size_t(0.99 * double(values.size())))];
}

// Shows `window` at 1280x800 and opens `path` in it; true once the analysis has finished.
static bool showAndAnalyse(MainWindow& window, const QString& path)
{
    window.resize(1280, 800);
    window.show();
    QSignalSpy finished(&window.controller(), &AnalysisController::finished);
    window.openPath(path);
    return finished.wait(60000);
}

static bool sameTo4Digits(double a, double b)
{
    if (std::isnan(a) || std::isnan(b))
        return std::isnan(a) && std::isnan(b);  // no data in both
    return std::abs(a - b) <= 5e-4 * std::max(std::abs(a), std::abs(b));
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
        QCOMPARE(table.value(h, 5), 1.0 - double(p.value(Metric::KCos, layer, token, h)));
        QCOMPARE(table.value(h, 9), double(p.value(Metric::VL2, layer, token, h)));
    }
    // The faulty head stands out in the table as in the data.
    QVERIFY(table.value(1, HeadTableModel::ratioColumn(KvPart::K)) > 20);
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
        for (int y = rect.top() * 2 + 14; y < rect.bottom() * 2 - 14; ++y)  // clear of the axes' ticks
            for (int dx = -5; dx <= 5; ++dx)
                if (isColour(QColor(image.pixel(x + dx, y))))
                    return true;
        return false;
    };
    // Off every palette (black, violet), each over a white outline.
    auto black = [](const QColor& c) { return c.red() < 40 && c.green() < 40 && c.blue() < 40; };
    auto violet = [](const QColor& c) { return c.red() > 140 && c.red() < 220 && c.green() < 50 && c.blue() > 180; };
    auto white = [](const QColor& c) { return c.red() > 245 && c.green() > 245 && c.blue() > 245; };
    QVERIFY2(columnHas(double(p.promptLen) - 0.5, black), "no prefill/decode line");
    QVERIFY2(columnHas(double(p.promptLen) - 0.5, white), "no outline around the prefill/decode line");
    QVERIFY2(columnHas(double(p.divergences.at(0).position), violet), "no divergence line");
    // And not everywhere: a column well inside the prefill has neither.
    QVERIFY(!columnHas(10.0, violet));
    QVERIFY(!columnHas(10.0, black));
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

void TestGui::emptyStateSaysWhatToDo()
{
    MainWindow fresh;
    fresh.resize(1280, 800);
    fresh.show();
    QVERIFY(QTest::qWaitForWindowExposed(&fresh));
    QVERIFY(fresh.heatmap().isEmpty());
    QVERIFY(!fresh.heatmap().colorScale()->visible());  // no scale that reads as "zero error"
    QCOMPARE(fresh.worstCells().rowCount(), 0);
    QCOMPARE(fresh.headTable().rowCount(), 0);
    int row;
    qint64 token;
    QVERIFY(!fresh.heatmap().cellAt(fresh.heatmap().axisRect()->center(), row, token));
}

void TestGui::oneRatioInEveryView()
{
    ensureDemoOpen();
    m_window->setMetric(HeatmapMetric::ErrorRatio);
    m_window->setPart(KvPart::K);
    const PromptAnalysis& p = m_reference.prompts[0];
    WorstCellsModel& list = m_window->worstCells();
    QVERIFY(list.rowCount() >= 10);
    // The list is ordered by the number it shows, and it shows the reference ratio.
    double previous = 1e300;
    for (int r = 0; r < list.rowCount(); ++r) {
        const WorstCell& c = list.cell(r);
        const double shown = list.data(list.index(r, 3)).toString().toDouble();
        QVERIFY2(shown <= previous * (1 + 5e-4), qPrintable(QString("row %1 not in order").arg(r)));
        previous = shown;
        int head = -1;
        const double expect = referenceRatio(p, c.part, c.layer, c.token, &head);
        QVERIFY2(sameTo4Digits(shown, expect), qPrintable(QString("row %1: %2 vs %3").arg(r).arg(shown).arg(expect)));
        QCOMPARE(c.head, head);
    }
    // The top cell, and the fault's cells, in every view.
    QList<QPair<int, qint64>> cells{{list.cell(0).layer, list.cell(0).token}, {5, 50}, {5, 47}, {2, 10}};
    for (const auto& [layer, token] : cells) {
        for (KvPart part : {KvPart::K, KvPart::V}) {
            m_window->setPart(part);
            int head = -1;
            const double expect = referenceRatio(p, part, layer, token, &head);
            // The heatmap
            QTRY_COMPARE(m_window->heatmap().grid().columns, p.tokens);
            QVERIFY2(sameTo4Digits(m_window->heatmap().grid().at(layer, token), expect), qPrintable(QString("%1 vs %2 layer %3 token %4").arg(m_window->heatmap().grid().at(layer, token)).arg(expect).arg(layer).arg(token)));
            // the tooltip
            const QString tip = m_window->promptPage().cellTooltip(layer, token);
            QVERIFY2(sameTo4Digits(numberAfter(tip, "max over heads:"), expect), qPrintable(tip));
            QVERIFY2(sameTo4Digits(numberAfter(tip, ", ratio"), expect), qPrintable(tip));
            QVERIFY2(std::isnan(expect) || tip.contains(QString("head %1:").arg(head)), qPrintable(tip));
            // the drill-down table, on the same head (a new selection starts on the worst head)
            m_window->promptPage().clearSelection();
            m_window->selectCell(layer, token);
            if (!std::isnan(expect))
                QCOMPARE(m_window->promptPage().drillDown().head(), head);
            const double inTable = m_window->headTable().value(head, HeadTableModel::ratioColumn(part));
            QVERIFY2(sameTo4Digits(inTable, expect), qPrintable(QString("table %1 vs %2").arg(inTable).arg(expect)));
            // every other head's ratio is below it, over the same floor
            for (int h = 0; h < p.heads && !std::isnan(expect); ++h)
                QVERIFY(m_window->headTable().value(h, HeadTableModel::ratioColumn(part)) <= inTable);
        }
    }
    m_window->setPart(KvPart::K);
}

void TestGui::panelsFollowThePromptAndKeepTheHead()
{
    ensureDemoOpen();
    m_window->setMetric(HeatmapMetric::RelLinf);
    m_window->selectCell(5, 50);
    DrillDownPanel& drill = m_window->promptPage().drillDown();
    // A head chosen in the table stays through metric and K/V switches.
    drill.showHead(2);
    QCOMPARE(drill.head(), 2);
    m_window->setMetric(HeatmapMetric::RelL2);
    m_window->setPart(KvPart::V);
    m_window->setMetric(HeatmapMetric::ErrorRatio);
    QCOMPARE(drill.head(), 2);
    QCOMPARE(m_window->selectedLayer(), 5);
    m_window->setPart(KvPart::K);
    // Another prompt: every panel shows a cell of that prompt (its worst), none of the old one.
    QSignalSpy histogram(m_window.get(), &MainWindow::histogramShown);
    m_window->setPrompt(1);
    const PromptAnalysis& p1 = m_reference.prompts[1];
    const std::vector<WorstCell> worst = worstCells(p1, 1);
    QCOMPARE(m_window->selectedLayer(), worst[0].layer);
    QCOMPARE(m_window->selectedToken(), worst[0].token);
    const QCPGraph* line = drill.line().graph(0);
    QCOMPARE(line->dataCount(), int(p1.tokens));
    for (int t = 0; t < int(p1.tokens); t += 7) {
        const double expect = p1.value(worst[0].part == KvPart::K ? Metric::KLinf : Metric::VLinf, worst[0].layer, t, drill.head());
        QVERIFY(std::isnan(expect) ? std::isnan(line->data()->at(t)->value) : line->data()->at(t)->value == expect);
    }
    QVERIFY(histogram.wait(20000) || histogram.count() > 0);
    QVERIFY(drill.histogram().hasHistogram());
    // Nothing selected: the panels say so rather than show the last cell.
    m_window->promptPage().clearSelection();
    QVERIFY(!drill.histogram().hasHistogram());
    QCOMPARE(drill.line().graph(0)->dataCount(), 0);
    QCOMPARE(m_window->headTable().rowCount(), 0);
    m_window->setPrompt(0);
}

void TestGui::failedOpenLeavesNothingStale()
{
    ensureDemoOpen();
    const QString broken = m_dir.filePath("stale.h5");
    QFile::remove(broken);
    QFile::copy(m_path, broken);
    QFile(broken).resize(QFile(broken).size() / 4);
    QSignalSpy failed(&m_window->controller(), &AnalysisController::failed);
    m_window->openPath(broken);
    QVERIFY(failed.wait(20000));
    QCoreApplication::processEvents();
    QVERIFY(m_window->heatmap().isEmpty());
    QCOMPARE(m_window->windowTitle(), QString("kvscope"));
    QCOMPARE(m_window->worstCells().rowCount(), 0);
    QCOMPARE(m_window->headTable().rowCount(), 0);
    QCOMPARE(m_window->toolbar().promptBox().count(), 0);
    QVERIFY(!m_window->findChild<QTabWidget*>()->isTabEnabled(1));
    QCOMPARE(m_window->selectedLayer(), -1);
    // Open Recent lists what opened, not what failed.
    QVERIFY(!QSettings().value("recentFiles").toStringList().contains(broken));
    QVERIFY(QSettings().value("recentFiles").toStringList().contains(m_path));
    for (QWidget* w : QApplication::topLevelWidgets())  // the message box
        if (w->inherits("QMessageBox"))
            w->close();
}

void TestGui::histogramAxesFitTheData()
{
    ensureDemoOpen();
    m_window->setMetric(HeatmapMetric::ErrorRatio);
    m_window->setPart(KvPart::K);
    DrillDownPanel& drill = m_window->promptPage().drillDown();
    QSignalSpy shown(m_window.get(), &MainWindow::histogramShown);
    m_window->selectCell(5, 50);  // the faulty head: errors far beyond the noise
    QVERIFY(shown.wait(20000) || shown.count() > 0);
    HistogramView& h = drill.histogram();
    QVERIFY(h.hasHistogram());
    const PromptAnalysis& p = m_reference.prompts[0];
    const double values = double(p.headDim);  // one token, one head
    for (bool logErrors : {true, false})
        for (bool logCounts : {false, true}) {
            h.setLogErrors(logErrors);
            h.setLogCounts(logCounts);
            const DisplayBins* bins = h.shownBins();
            QVERIFY(bins && !bins->edges.empty());
            double total = double(bins->actualApart), top = 0;
            for (double c : bins->actual)
                total += c, top = std::max(top, c);
            for (double c : bins->base)
                top = std::max(top, c);
            QCOMPARE(total, values);  // every error counted, in a bin or apart
            // The x axis holds every bin; the y axis the tallest bar with room to spare.
            QVERIFY(h.xAxis->range().lower <= bins->edges.front() && h.xAxis->range().upper >= bins->edges.back());
            QVERIFY(h.yAxis->range().upper > top);
            if (!logErrors) {
                // Linear: cut at the 99th percentile, the rest is an overflow bar that is labelled.
                QVERIFY(bins->edges.front() == 0);
                if (bins->actualApart + bins->baseApart > 0) {
                    QVERIFY2(h.apartLabel().startsWith(QString("> %1").arg(bins->edges.back(), 0, 'g', 3)), qPrintable(h.apartLabel()));
                    QVERIFY(h.xAxis->range().upper > bins->edges.back());
                }
            } else {
                // Log: the bins span orders of magnitude, from the smallest positive error.
                QVERIFY(bins->edges.back() / bins->edges.front() > 10);
            }
        }
    h.setLogErrors(true);
    h.setLogCounts(false);
}

void TestGui::zoomStaysInTheDataAndResets()
{
    ensureDemoOpen();
    HeatmapView& view = m_window->heatmap();
    const PromptAnalysis& p = m_reference.prompts[0];
    const QCPRange full(-0.5, double(p.tokens) - 0.5);
    auto wheel = [&](int delta) {
        const QPointF at = view.axisRect()->center();
        QWheelEvent event(at, view.mapToGlobal(at), {}, QPoint(0, delta), Qt::NoButton, Qt::NoModifier, Qt::NoScrollPhase, false);
        QApplication::sendEvent(&view, &event);
    };
    for (int i = 0; i < 10; ++i)
        wheel(-120);  // zoom out: no further than the data
    QCOMPARE(view.xAxis->range().lower, full.lower);
    QCOMPARE(view.xAxis->range().upper, full.upper);
    QCOMPARE(view.yAxis->range().lower, -0.5);
    QCOMPARE(view.yAxis->range().upper, 7.5);
    wheel(960);  // zoom in
    QVERIFY(view.xAxis->range().size() < full.size() / 2);
    QVERIFY(view.xAxis->range().lower >= full.lower && view.xAxis->range().upper <= full.upper);
    view.setFocus();
    QTest::keyClick(&view, Qt::Key_Home);
    QCOMPARE(view.xAxis->range().size(), full.size());
    wheel(480);
    QTest::keyClick(&view, Qt::Key_0, Qt::ControlModifier);
    QCOMPARE(view.xAxis->range().size(), full.size());
    wheel(480);
    QTest::mouseDClick(&view, Qt::LeftButton, {}, view.axisRect()->center());
    QCOMPARE(view.xAxis->range().size(), full.size());
}

void TestGui::dragPansWithoutSelecting()
{
    ensureDemoOpen();
    HeatmapView& view = m_window->heatmap();
    view.resetZoom();
    view.xAxis->setRange(10, 30);  // zoomed in, so there is room to pan
    view.replot(QCustomPlot::rpImmediateRefresh);
    m_window->selectCell(2, 20);
    const QPoint from(int(view.xAxis->coordToPixel(20)), int(view.yAxis->coordToPixel(4)));
    const QPoint to = from + QPoint(-120, 0);
    QTest::mousePress(&view, Qt::LeftButton, {}, from);
    QMouseEvent move(QEvent::MouseMove, to, view.mapToGlobal(to), Qt::NoButton, Qt::LeftButton, Qt::NoModifier);
    QApplication::sendEvent(&view, &move);
    QTest::mouseRelease(&view, Qt::LeftButton, {}, to);
    QVERIFY(view.xAxis->range().lower > 10);  // panned
    QCOMPARE(m_window->selectedLayer(), 2);     // and the selection stayed
    QCOMPARE(m_window->selectedToken(), qint64(20));
    // A click without movement selects.
    const QPoint at(int(view.xAxis->coordToPixel(25)), int(view.yAxis->coordToPixel(6)));
    QTest::mouseClick(&view, Qt::LeftButton, {}, at);
    QCOMPARE(m_window->selectedLayer(), 6);
    QCOMPARE(m_window->selectedToken(), qint64(25));
    view.resetZoom();
}

void TestGui::keyboardReachesEveryPanel()
{
    ensureDemoOpen();
    m_window->activateWindow();
    HeatmapView& view = m_window->heatmap();
    QTableView& heads = m_window->promptPage().drillDown().headView();
    QTableView& worst = m_window->promptPage().worstCellsView();
    QVERIFY(view.focusPolicy() & Qt::TabFocus);
    view.setFocus();
    QTRY_VERIFY(view.hasFocus());
    // Tab: heatmap -> head table -> ... -> worst cells, never stuck inside a table.
    QTest::keyClick(QApplication::focusWidget(), Qt::Key_Tab);
    QTRY_VERIFY(heads.hasFocus());
    QVERIFY(!heads.tabKeyNavigation());
    QTest::keyClick(QApplication::focusWidget(), Qt::Key_Tab);
    QVERIFY(!heads.hasFocus());
    for (int i = 0; i < 6 && !worst.hasFocus(); ++i)
        QTest::keyClick(QApplication::focusWidget(), Qt::Key_Tab);
    QVERIFY(worst.hasFocus());
    // Up/Down in the worst cells go to the cell; Enter goes to the map.
    worst.setCurrentIndex(worst.model()->index(0, 0));
    QTest::keyClick(&worst, Qt::Key_Down);
    const WorstCell second = m_window->worstCells().cell(1);
    QCOMPARE(m_window->selectedLayer(), second.layer);
    QCOMPARE(m_window->selectedToken(), second.token);
    QCOMPARE(m_window->spec().part, second.part);
    QTest::keyClick(&worst, Qt::Key_Return);
    QTRY_VERIFY(view.hasFocus());
    // Arrows on the map move the selection; Esc clears it.
    QTest::keyClick(&view, Qt::Key_Left);
    QCOMPARE(m_window->selectedToken(), second.token - 1);
    QTest::keyClick(&view, Qt::Key_Escape);
    QCOMPARE(m_window->selectedLayer(), -1);
    // Shortcuts: K / V, metrics 1-6, prompts.
    QTest::keyClick(&view, Qt::Key_V);
    QCOMPARE(m_window->spec().part, KvPart::V);
    QTest::keyClick(&view, Qt::Key_K);
    QCOMPARE(m_window->spec().part, KvPart::K);
    QTest::keyClick(&view, Qt::Key_2);
    QCOMPARE(m_window->spec().metric, HeatmapMetric::RelL2);
    QTest::keyClick(&view, Qt::Key_5);
    QCOMPARE(m_window->spec().metric, HeatmapMetric::BcVsNoise);
    QTest::keyClick(&view, Qt::Key_PageDown, Qt::ControlModifier);
    QCOMPARE(m_window->toolbar().promptBox().currentIndex(), 1);
    QTest::keyClick(&view, Qt::Key_PageUp, Qt::ControlModifier);
    QCOMPARE(m_window->toolbar().promptBox().currentIndex(), 0);
}

void TestGui::layoutFitsAt1280x800AndIsRemembered()
{
    ensureDemoOpen();
    m_window->setMetric(HeatmapMetric::ErrorRatio);
    m_window->resize(1280, 800);
    m_window->selectCell(5, 50);
    QCoreApplication::processEvents();
    m_window->heatmap().replot(QCustomPlot::rpImmediateRefresh);
    // Every layer labelled.
    auto ticker = qSharedPointerDynamicCast<QCPAxisTickerText>(m_window->heatmap().yAxis->ticker());
    QCOMPARE(ticker->ticks().size(), 8);
    // The worst cells' columns (the ranking key included) and the current part's head columns
    // fit without a horizontal scroll; the head numbers are a fixed header.
    QTableView& worst = m_window->promptPage().worstCellsView();
    QTRY_COMPARE(worst.horizontalScrollBar()->maximum(), 0);
    QTableView& heads = m_window->promptPage().drillDown().headView();
    QTRY_COMPARE(heads.horizontalScrollBar()->maximum(), 0);
    QVERIFY(heads.verticalHeader()->isVisible());
    QCOMPARE(heads.model()->headerData(0, Qt::Vertical).toString().left(4), QString("head"));
    // Splitter sizes are remembered.
    QSplitter& split = m_window->promptPage().mapSplitter();
    split.setSizes({300, 400});
    const QList<int> chosen = split.sizes();
    m_window->close();
    MainWindow again;
    again.resize(1280, 800);
    again.show();
    QVERIFY(QTest::qWaitForWindowExposed(&again));
    QCOMPARE(again.promptPage().mapSplitter().sizes(), chosen);
    m_window->show();
}

void TestGui::colourRangeComesFromTheData()
{
    ensureDemoOpen();
    m_window->setMetric(HeatmapMetric::RelL2);
    m_window->setPart(KvPart::V);
    // Default: up to twice the 99th percentile of the dtype noise (max over heads of base V L2).
    const PromptAnalysis& p = m_reference.prompts[0];
    const double expectUpper = 2 * percentile99OfCellMaxima(p, Metric::BaseVL2);
    const QCPRange range = m_window->heatmap().colorScale()->dataRange();
    QVERIFY2(std::abs(range.upper - expectUpper) <= 1e-6 * expectUpper, qPrintable(QString("%1 vs %2").arg(range.upper).arg(expectUpper)));
    QCOMPARE(range.lower, 0.0);
    QVERIFY(expectUpper < 0.1);  // far below the reference tool's fixed 0.2: the noise is visible
    // Log with a lower bound of 0: the scale starts at a positive value from the data.
    ViewSettings s = m_window->toolbar().settings();
    s.autoRange = false;
    s.range = {0.0, 0.2};
    s.logarithmic = true;
    m_window->promptPage().apply(s, false);
    const QCPRange log = m_window->heatmap().colorScale()->dataRange();
    QVERIFY(log.lower > 0 && log.lower < 0.2);
    QCOMPARE(m_window->heatmap().colorScale()->axis()->scaleType(), QCPAxis::stLogarithmic);
    m_window->promptPage().apply(m_window->toolbar().settings(), false);
    m_window->setPart(KvPart::K);
}

void TestGui::acrossPromptsLeadsToThePrompt()
{
    ensureDemoOpen();
    m_window->showAcrossPrompts(true);
    QComboBox& prompts = m_window->toolbar().promptBox();
    QVERIFY(!prompts.isEnabled());  // what does not apply there is off
    const AggregateBc& a = *m_reference.aggregate;
    // Row labels carry the attention kind.
    auto ticker = qSharedPointerDynamicCast<QCPAxisTickerText>(m_window->aggregateHeatmap().yAxis->ticker());
    QVERIFY(ticker && !ticker->ticks().isEmpty());
    for (const QString& label : ticker->ticks())
        QVERIFY2(label.contains("[sliding") || label.contains("[full"), qPrintable(label));
    // A click goes to the prompt where that cell's BC vs noise is lowest.
    const int layer = 5;
    const qint64 g = 3;
    int expectPrompt = -1;
    double lowest = 2;
    for (int i = 0; i < int(m_reference.prompts.size()); ++i) {
        const PromptAnalysis& p = m_reference.prompts[std::size_t(i)];
        const double bc = p.bcVsNoiseValue(KvPart::K, layer, p.promptLen + g);
        if (bc < lowest)
            lowest = bc, expectPrompt = i;
    }
    QVERIFY(expectPrompt >= 0 && g < a.generationCount);
    emit m_window->acrossPage().cellChosen(layer, g);
    QCOMPARE(m_window->toolbar().promptBox().currentIndex(), expectPrompt);
    QVERIFY(prompts.isEnabled());
    QCOMPARE(m_window->selectedLayer(), layer);
    QCOMPARE(m_window->selectedToken(), m_reference.prompts[std::size_t(expectPrompt)].promptLen + g);
    m_window->setPrompt(0);
}

void TestGui::linePlotShowsAllItsData()
{
    ensureDemoOpen();
    m_window->setMetric(HeatmapMetric::RelLinf);
    m_window->selectCell(5, 50);
    TokenLineView& line = m_window->promptPage().drillDown().line();
    line.replot(QCustomPlot::rpImmediateRefresh);
    // The legend sits outside the plotted area, the curves below its top edge.
    QVERIFY(!line.legend->outerRect().intersects(line.axisRect()->rect()));
    double top = 0;
    for (int g = 0; g < 2; ++g)
        for (auto it = line.graph(g)->data()->constBegin(); it != line.graph(g)->data()->constEnd(); ++it)
            if (std::isfinite(it->value))
                top = std::max(top, it->value);
    QVERIFY(line.yAxis->range().upper > top);
    // The prefill | decode marker is not the colour of a curve.
    QVERIFY(toQColor(kPrefillLineColor) != line.graph(0)->pen().color());
    QVERIFY(toQColor(kPrefillLineColor) != line.graph(1)->pen().color());
}

void TestGui::cancelKeepsWhatWasAnalysed()
{
    MainWindow window;
    window.resize(1280, 800);
    window.show();
    QSignalSpy cancelled(&window.controller(), &AnalysisController::cancelled);
    QSignalSpy finished(&window.controller(), &AnalysisController::finished);
    // Cancelled by the worker itself after its first layer: the same point on every machine
    // (a cancel from this thread could arrive after the last of 8 small layers).
    AnalysisController& controller = window.controller();
    controller.setWorkerLayerHook([&controller](int) { controller.cancel(); });
    window.openPath(m_path);
    QTRY_VERIFY_WITH_TIMEOUT(cancelled.count() + finished.count() > 0, 60000);
    QCOMPARE(cancelled.count(), 1);
    QCOMPARE(finished.count(), 0);
    const std::vector<char>& ready = controller.readyLayers();
    const int done = int(std::count(ready.begin(), ready.end(), 1));
    QVERIFY(done >= 1);  // one per worker at most: 8 only with 8 or more cores
    // The finished layers are ranked; the others are covered and said to be not analysed.
    QVERIFY(window.worstCells().rowCount() > 0);
    for (int r = 0; r < window.worstCells().rowCount(); ++r)
        QVERIFY(ready[std::size_t(window.worstCells().cell(r).layer)]);
    if (done == 8)
        return;
    int notReady = 0;
    while (ready[std::size_t(notReady)])
        ++notReady;
    QVERIFY(window.promptPage().cellTooltip(notReady, 0).contains("not analysed"));
    bool covered = false;
    for (int i = 0; i < window.heatmap().itemCount(); ++i)
        if (auto* text = qobject_cast<QCPItemText*>(window.heatmap().item(i)); text && text->text().contains("cancelled"))
            covered = true;
    QVERIFY(covered);
}

void TestGui::tooltipUsesTokenTextAndDivergenceBounds()
{
    ensureDemoOpen();
    const PromptAnalysis& p = m_reference.prompts[0];
    const PromptInfo& info = m_reader->prompt(p.id);
    QVERIFY(!info.tokenStrings.empty());
    const QString tip = m_window->promptPage().cellTooltip(3, 12);
    QVERIFY2(tip.contains("'" + QString::fromStdString(info.tokenStrings[12]) + "'"), qPrintable(tip));
    const Divergence& d = p.divergences.at(0);
    const QString atDivergence = m_window->promptPage().cellTooltip(3, d.position);
    QVERIFY2(atDivergence.contains("divergence"), qPrintable(atDivergence));
    if (d.inBounds)
        QVERIFY(atDivergence.contains(*d.inBounds ? "within the bf16 bound" : "beyond the bf16 bound"));
}

void TestGui::twoWayCaptureRanksByError()
{
    SyntheticCaptureOptions o = demoCaptureOptions();
    o.baseline = false;
    const QString path = m_dir.filePath("two-way.h5");
    writeSyntheticCapture(path.toStdString(), o);
    const AnalysisResult reference = analyzeBundle(std::make_shared<BundleReader>(path.toStdString()));
    MainWindow window;
    QVERIFY(showAndAnalyse(window, path));
    QCOMPARE(window.spec().metric, HeatmapMetric::RelLinf);  // no ratio without a baseline
    const PromptAnalysis& p = reference.prompts[0];
    WorstCellsModel& list = window.worstCells();
    QVERIFY(list.rowCount() > 0);
    double previous = 1e300;
    for (int r = 0; r < list.rowCount(); ++r) {
        const WorstCell& c = list.cell(r);
        double worst = -1;
        for (int h = 0; h < p.heads; ++h)
            worst = std::max(worst, double(p.value(c.part == KvPart::K ? Metric::KLinf : Metric::VLinf, c.layer, c.token, h)));
        const double shown = list.data(list.index(r, 3)).toString().toDouble();
        QVERIFY(sameTo4Digits(shown, worst));
        QVERIFY(shown <= previous * (1 + 5e-4));
        previous = shown;
    }
    QVERIFY(window.promptPage().worstCellsView().isColumnHidden(5));
    window.selectCell(5, 50);
    QVERIFY(std::isnan(window.headTable().value(0, HeadTableModel::ratioColumn(KvPart::K))));
    // The colour range: up to the 99th percentile of the shown values.
    const double expect = percentile99OfCellMaxima(p, Metric::KLinf);
    QVERIFY(std::abs(window.heatmap().colorScale()->dataRange().upper - expect) <= 1e-6 * expect);
}

void TestGui::suspectsLeadToTheBug()
{
    ensureDemoOpen();
    const PromptAnalysis& p = m_reference.prompts[0];
    QVERIFY(!p.suspects.empty());
    const Suspect& s = p.suspects.front();
    // The demo's fault: layer 5, head 1, from token 46.
    QCOMPARE(s.firstLayer, std::string("model.layers.5.self_attn"));
    QVERIFY(std::find(s.heads.begin(), s.heads.end(), 1) != s.heads.end());
    QListWidget& list = m_window->promptPage().suspectsView();
    QCOMPARE(list.count(), int(p.suspects.size()));
    list.setCurrentRow(-1);
    m_window->selectCell(0, 0);
    list.setCurrentRow(0);
    QCOMPARE(m_window->selectedLayer(), s.worstLayer);
    QCOMPARE(m_window->selectedToken(), s.worstToken);
    QCOMPARE(m_window->spec().part, s.worstPart);
    QCOMPARE(m_window->promptPage().drillDown().head(), s.worstHead);
    QCOMPARE(m_window->promptPage().suspectEvidence(), QString::fromStdString(s.evidence));
    QVERIFY(m_window->heatmap().hasHighlight());
    for (int h = 0; h < p.heads; ++h)
        QCOMPARE(m_window->headTable().isHighlighted(h), std::find(s.heads.begin(), s.heads.end(), h) != s.heads.end());
}

QTEST_MAIN(TestGui)
#include "tst_gui.moc"

// The file changes under the open window: truncated (a later read fails with a message
// naming it, in the panel that needed it), then replaced by another file (opening it again
// shows the new one). No crash either way.
void TestGui::bundleTruncatedOrReplacedWhileOpen()
{
    const QString live = m_dir.filePath("live.h5");
    QFile::remove(live);
    QVERIFY(QFile::copy(m_path, live));
    MainWindow window;
    QVERIFY(showAndAnalyse(window, live));
    QVERIFY(QFile(live).resize(QFile(live).size() / 3));
    QSignalSpy histogram(&window, &MainWindow::histogramShown);
    window.selectCell(6, 40);  // the drill-down reads this head's values from the file again
    QTRY_VERIFY_WITH_TIMEOUT(histogram.count() > 0, 20000);
    const auto views = window.findChildren<HistogramView*>();
    QVERIFY(!views.isEmpty());
    const QString message = views.first()->message();
    QVERIFY2(message.startsWith("no histogram") && message.contains(live), qPrintable(message));

    // Replaced: a new file under the same name (as a writer's rename does).
    const QString next = m_dir.filePath("next.h5");
    QFile::remove(next);
    QVERIFY(QFile::copy(m_path, next));
    QVERIFY(std::rename(next.toUtf8().constData(), live.toUtf8().constData()) == 0);
    QVERIFY(showAndAnalyse(window, live));
    QCOMPARE(window.controller().result()->prompts.size(), m_reference.prompts.size());
}

// A folder import runs a child process: cancelling kills it, and so does closing the window,
// at once (the stand-in helper would take 60 s).
void TestGui::importCanBeCancelledAndClosed()
{
    const QString helper = m_dir.filePath("slow-import.sh");
    QFile script(helper);
    QVERIFY(script.open(QIODevice::WriteOnly));
    script.write("#!/bin/sh\nsleep 60\n");
    script.close();
    script.setPermissions(QFileDevice::ReadOwner | QFileDevice::ExeOwner);
    qputenv("KVSCOPE_IMPORT_HELPER", helper.toUtf8());
    const QString folder = m_dir.filePath("dumps");
    QDir().mkpath(folder);
    QElapsedTimer clock;
    clock.start();
    {
        MainWindow window;
        QSignalSpy cancelled(&window.controller(), &AnalysisController::cancelled);
        window.openPath(folder);
        QTest::qWait(300);  // the helper is running
        QVERIFY(window.controller().isRunning());
        window.controller().cancel();
        QVERIFY(cancelled.wait(10000));
        QVERIFY(!window.controller().isRunning());
        window.openPath(folder);
        QTest::qWait(300);
    }  // closed while importing
    qunsetenv("KVSCOPE_IMPORT_HELPER");
    QVERIFY2(clock.elapsed() < 20000, "closing waited for the import");
}

// A second open() while the first bundle is still analysing: the first run is dropped, the
// second one's results are the ones shown, and nothing of the first arrives later.
void TestGui::secondBundleWhileTheFirstAnalyses()
{
    const QString other = m_dir.filePath("other.h5");
    if (!QFileInfo::exists(other)) {
        SyntheticCaptureOptions options = demoCaptureOptions();
        options.faultLayer = -1;  // a different bundle: no fault
        writeSyntheticCapture(other.toStdString(), options);
    }
    MainWindow window;
    QSignalSpy opened(&window.controller(), &AnalysisController::opened);
    QSignalSpy finished(&window.controller(), &AnalysisController::finished);
    AnalysisController& controller = window.controller();
    // After the first bundle's first layer, its worker waits until this thread has opened the
    // second bundle: the first run is certainly still going when it does.
    std::atomic<bool> reached = false;  // the hook runs on every analysis worker
    std::promise<void> opened2;
    std::shared_future<void> secondOpened = opened2.get_future().share();
    controller.setWorkerLayerHook([&reached, secondOpened](int) {
        if (!reached.exchange(true))
            secondOpened.wait();
    });
    window.openPath(m_path);
    QTRY_VERIFY_WITH_TIMEOUT(reached, 60000);
    controller.setWorkerLayerHook({});
    window.openPath(other);
    opened2.set_value();
    QTRY_VERIFY_WITH_TIMEOUT(finished.count() == 1, 60000);
    QTest::qWait(200);  // anything the first run still posted would arrive now
    QCOMPARE(finished.count(), 1);
    QCOMPARE(controller.path(), other);
    QCOMPARE(opened.last().first().toString(), other);
    const AnalysisResult expected = analyzeBundle(std::make_shared<BundleReader>(other.toStdString()));
    const PromptAnalysis& shown = controller.result()->prompts.at(0);
    for (int m = 0; m < kMetricCount; ++m)
        QVERIFY(std::memcmp(shown.metrics[std::size_t(m)].data(), expected.prompts[0].metrics[std::size_t(m)].data(),
                            shown.metrics[std::size_t(m)].size() * sizeof(float)) == 0);
}

// libhdf5 crashing on a file (a segmentation fault inside the library, simulated here in the
// child that opens every bundle first) is a message naming the file; the window lives on.
void TestGui::hdf5CrashIsAMessage()
{
    if (!BundleReader::kProbeFromThreads)
        QSKIP("no probe child in the app under ThreadSanitizer or AddressSanitizer (no fork() with threads there)");
    MainWindow window;
    QSignalSpy failed(&window.controller(), &AnalysisController::failed);
    window.controller().setProbeHook([] { std::raise(SIGSEGV); });
    window.openPath(m_path);
    QVERIFY(failed.wait(20000));
    const QString message = failed.first().first().toString();
    QVERIFY2(message.contains(m_path) && message.contains("crashed the HDF5 library"), qPrintable(message));
    window.controller().setProbeHook({});
    QSignalSpy finished(&window.controller(), &AnalysisController::finished);
    window.openPath(m_path);
    QVERIFY(finished.wait(60000));
}
