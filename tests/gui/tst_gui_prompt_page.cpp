// The per-prompt page: the heatmap against the engine's own numbers, selection by mouse and
// keyboard, zoom and pan, the colour range, tooltips, the worst cells and the suspects, the
// exported view's markers found in its pixels.

#include "gui_test_support.h"

#include "analysis/impact_view_text.h"
#include "gui/head_table_model.h"
#include "gui/worst_cells_model.h"
#include "small_model.h"
#include "widgets/histogram_view.h"
#include "widgets/impact_column.h"
#include "widgets/plot_export.h"
#include "widgets/token_line_view.h"

#include <QAbstractItemModelTester>
#include <QApplication>
#include <QComboBox>
#include <QDir>
#include <QElapsedTimer>
#include <QFile>
#include <QHeaderView>
#include <QImage>
#include <QLabel>
#include <QListWidget>
#include <QScrollBar>
#include <QSplitter>
#include <QStandardItemModel>
#include <QSortFilterProxyModel>
#include <QStatusBar>
#include <QTableView>
#include <QTabWidget>
#include <QToolBar>
#include <QWheelEvent>

#include <atomic>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <future>

using namespace kvscope;
using namespace kvtest;

class TestPromptPage : public GuiSuite {
    Q_OBJECT

private slots:
    void initTestCase() { initDemo(); }
    void heatmapShowsTheEngineNumbers();
    void clickOpensTheDrillDown();
    void arrowKeysMoveTheSelection();
    void exportedPngHasTheMarkers();
    void oneRatioInEveryView();
    void zoomStaysInTheDataAndResets();
    void dragPansWithoutSelecting();
    void keyboardReachesEveryPanel();
    void colourRangeComesFromTheData();
    void tooltipUsesTokenTextAndDivergenceBounds();
    void twoWayCaptureRanksByError();
    void suspectsLeadToTheBug();
    // The rough edges a new user met, each checked.
    void enterGoesToTheHeadTable();
    void tabbingIntoWorstCellsKeepsTheCell();
    void doubleClickOnlyResetsTheZoom();
    void selectedAndSuspectRowsKeepTheirLabels();
    void impactInTheSuspectRowAndBesideTheMap();
    void tokenLabelsDoNotOverlap();
    void tooltipNamesItsBc();
};

void TestPromptPage::heatmapShowsTheEngineNumbers()
{
    ensureDemoOpen();  // alone in its suite now: not after the test that opened it
    for (int prompt : {0, 1})
        for (HeatmapMetric metric : {HeatmapMetric::RelLinf, HeatmapMetric::ErrorRatio, HeatmapMetric::Bc})
            for (KvPart part : {KvPart::K, KvPart::V}) {
                toolbarOf(*m_window).setPrompt(prompt);
                toolbarOf(*m_window).setMetric(metric);
                toolbarOf(*m_window).setPart(part);
                const PromptAnalysis& p = m_reference.prompts[std::size_t(prompt)];
                waitForMap(*m_window);
                QTRY_COMPARE(heatmapOf(*m_window).grid().columns, p.tokens);  // few tokens: no pooling
                const HeatmapGrid& shown = heatmapOf(*m_window).grid();
                QCOMPARE(shown.rows, 8);
                HeatmapSpec spec;
                spec.metric = metric;
                spec.part = part;
                for (int l = 0; l < 8; ++l)
                    for (std::int64_t t = 0; t < p.tokens; ++t) {
                        float expect = heatmapValue(p, spec, l, t);
                        // in floors, drawn in units of the layer's off threshold
                        if (metric == HeatmapMetric::ErrorRatio)
                            expect = float(expect / offThresholdByFormula(p, l));
                        const float got = shown.at(l, t);
                        QVERIFY2(std::isnan(expect) ? std::isnan(got) : sameTo4Digits(got, expect),
                                 qPrintable(QString("prompt %1 layer %2 token %3: %4 vs %5").arg(prompt).arg(l).arg(t).arg(got).arg(expect)));
                    }
            }
}

void TestPromptPage::clickOpensTheDrillDown()
{
    ensureDemoOpen();  // alone in its suite now: not after the test that opened it
    toolbarOf(*m_window).setPrompt(0);
    toolbarOf(*m_window).setMetric(HeatmapMetric::ErrorRatio);
    toolbarOf(*m_window).setPart(KvPart::K);
    HeatmapView& view = heatmapOf(*m_window);
    view.resetView(m_reference.prompts[0].tokens, 8);
    view.replot(QCustomPlot::rpImmediateRefresh);
    const int layer = 5;
    const qint64 token = 50;  // the fault: layer 5, head 1, from token 46
    const QPoint at(int(view.xAxis->coordToPixel(double(token))), int(view.yAxis->coordToPixel(layer)));
    // Before the click: the histogram may be read while the click waits out the double-click.
    QSignalSpy histogram(&drillDownOf(*m_window), &DrillDownPanel::histogramShown);
    QTest::mouseClick(&view, Qt::LeftButton, {}, at);
    QTRY_COMPARE(promptPageOf(*m_window).selectedToken(), token);  // once it cannot be a double-click
    QCOMPARE(promptPageOf(*m_window).selectedLayer(), layer);
    const PromptAnalysis& p = m_reference.prompts[0];
    HeadTableModel& table = headTableOf(*m_window);
    QCOMPARE(table.rowCount(), p.heads);
    for (int h = 0; h < p.heads; ++h) {
        QCOMPARE(table.value(h, 1), double(p.value(Metric::KLinf, layer, token, h)));
        QCOMPARE(table.value(h, 2), double(p.value(Metric::BaseKLinf, layer, token, h)));
        QCOMPARE(table.value(h, 4), 1.0 - double(p.value(Metric::KCos, layer, token, h)));
        QCOMPARE(table.value(h, 8), double(p.value(Metric::VL2, layer, token, h)));
        // the base L2 in the L2 cell's tooltip
        const QString tip = table.data(table.index(h, 3), Qt::ToolTipRole).toString();
        QVERIFY2(tip.contains(QString("expected vs baseline (dtype noise): %1").arg(double(p.value(Metric::BaseKL2, layer, token, h)), 0, 'g', 4)),
                 qPrintable(tip));
    }
    // The faulty head stands out in the table as in the data.
    QVERIFY(table.value(1, HeadTableModel::ratioColumn(KvPart::K)) > 20);
    QVERIFY(histogram.wait(20000) || histogram.count() > 0);
}

void TestPromptPage::arrowKeysMoveTheSelection()
{
    ensureDemoOpen();  // alone in its suite now: not after the test that opened it
    promptPageOf(*m_window).selectCell(3, 20);
    QTest::keyClick(m_window.get(), Qt::Key_Right);
    QCOMPARE(promptPageOf(*m_window).selectedToken(), qint64(21));
    QTest::keyClick(m_window.get(), Qt::Key_Down);
    QCOMPARE(promptPageOf(*m_window).selectedLayer(), 4);
}

void TestPromptPage::exportedPngHasTheMarkers()
{
    ensureDemoOpen();  // alone in its suite now: not after the test that opened it
    toolbarOf(*m_window).setPrompt(0);
    toolbarOf(*m_window).setMetric(HeatmapMetric::RelLinf);
    HeatmapView& view = heatmapOf(*m_window);
    view.resetView(m_reference.prompts[0].tokens, 8);
    view.replot(QCustomPlot::rpImmediateRefresh);
    const QString png = m_dir.filePath("view.png");
    QVERIFY(exportPlot(heatmapOf(*m_window), png));
    QVERIFY(exportPlot(heatmapOf(*m_window), m_dir.filePath("view.pdf")));
    QVERIFY(exportPlot(heatmapOf(*m_window), m_dir.filePath("view.svg")));
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

void TestPromptPage::oneRatioInEveryView()
{
    ensureDemoOpen();
    toolbarOf(*m_window).setMetric(HeatmapMetric::ErrorRatio);
    toolbarOf(*m_window).setPart(KvPart::K);
    const PromptAnalysis& p = m_reference.prompts[0];
    WorstCellsModel& list = promptPageOf(*m_window).worstCells();
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
            toolbarOf(*m_window).setPart(part);
            int head = -1;
            const double expect = referenceRatio(p, part, layer, token, &head);
            // The heatmap
            waitForMap(*m_window);
            QTRY_COMPARE(heatmapOf(*m_window).grid().columns, p.tokens);
            const double drawn = heatmapOf(*m_window).grid().at(layer, token) * offThresholdByFormula(p, layer);  // (in units of it)
            QVERIFY2(sameTo4Digits(drawn, expect), qPrintable(QString("%1 vs %2 layer %3 token %4").arg(drawn).arg(expect).arg(layer).arg(token)));
            // the tooltip
            const QString tip = promptPageOf(*m_window).cellTooltip(layer, token);
            QVERIFY2(sameTo4Digits(numberAfter(tip, "max over heads:"), expect), qPrintable(tip));
            QVERIFY2(sameTo4Digits(numberAfter(tip, ", ratio"), expect), qPrintable(tip));
            QVERIFY2(std::isnan(expect) || tip.contains(QString("head %1:").arg(head)), qPrintable(tip));
            // the drill-down table, on the same head (a new selection starts on the worst head)
            promptPageOf(*m_window).clearSelection();
            promptPageOf(*m_window).selectCell(layer, token);
            if (!std::isnan(expect))
                QCOMPARE(promptPageOf(*m_window).drillDown().head(), head);
            const double inTable = headTableOf(*m_window).value(head, HeadTableModel::ratioColumn(part));
            QVERIFY2(sameTo4Digits(inTable, expect), qPrintable(QString("table %1 vs %2").arg(inTable).arg(expect)));
            // every other head's ratio is below it, over the same floor
            for (int h = 0; h < p.heads && !std::isnan(expect); ++h)
                QVERIFY(headTableOf(*m_window).value(h, HeadTableModel::ratioColumn(part)) <= inTable);
        }
    }
    toolbarOf(*m_window).setPart(KvPart::K);
}

void TestPromptPage::zoomStaysInTheDataAndResets()
{
    ensureDemoOpen();
    HeatmapView& view = heatmapOf(*m_window);
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

void TestPromptPage::dragPansWithoutSelecting()
{
    ensureDemoOpen();
    HeatmapView& view = heatmapOf(*m_window);
    view.resetZoom();
    view.xAxis->setRange(10, 30);  // zoomed in, so there is room to pan
    view.replot(QCustomPlot::rpImmediateRefresh);
    promptPageOf(*m_window).selectCell(2, 20);
    const QPoint from(int(view.xAxis->coordToPixel(20)), int(view.yAxis->coordToPixel(4)));
    const QPoint to = from + QPoint(-120, 0);
    QTest::mousePress(&view, Qt::LeftButton, {}, from);
    QMouseEvent move(QEvent::MouseMove, to, view.mapToGlobal(to), Qt::NoButton, Qt::LeftButton, Qt::NoModifier);
    QApplication::sendEvent(&view, &move);
    QTest::mouseRelease(&view, Qt::LeftButton, {}, to);
    QVERIFY(view.xAxis->range().lower > 10);  // panned
    QCOMPARE(promptPageOf(*m_window).selectedLayer(), 2);     // and the selection stayed
    QCOMPARE(promptPageOf(*m_window).selectedToken(), qint64(20));
    // A click without movement selects.
    const QPoint at(int(view.xAxis->coordToPixel(25)), int(view.yAxis->coordToPixel(6)));
    QTest::mouseClick(&view, Qt::LeftButton, {}, at);
    QTRY_COMPARE(promptPageOf(*m_window).selectedLayer(), 6);  // once it cannot be a double-click
    QTRY_COMPARE(promptPageOf(*m_window).selectedToken(), qint64(25));
    view.resetZoom();
}

void TestPromptPage::keyboardReachesEveryPanel()
{
    ensureDemoOpen();
    m_window->activateWindow();
    HeatmapView& view = heatmapOf(*m_window);
    QTableView& heads = promptPageOf(*m_window).drillDown().headView();
    QTableView& worst = promptPageOf(*m_window).worstCellsView();
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
    const WorstCell second = promptPageOf(*m_window).worstCells().cell(1);
    QCOMPARE(promptPageOf(*m_window).selectedLayer(), second.layer);
    QCOMPARE(promptPageOf(*m_window).selectedToken(), second.token);
    QCOMPARE(toolbarOf(*m_window).settings().map.part, second.part);
    QTest::keyClick(&worst, Qt::Key_Return);
    QTRY_VERIFY(view.hasFocus());
    // Arrows on the map move the selection; Esc clears it.
    QTest::keyClick(&view, Qt::Key_Left);
    QCOMPARE(promptPageOf(*m_window).selectedToken(), second.token - 1);
    QTest::keyClick(&view, Qt::Key_Escape);
    QCOMPARE(promptPageOf(*m_window).selectedLayer(), -1);
    // Shortcuts: K / V, metrics 1-6, prompts.
    QTest::keyClick(&view, Qt::Key_V);
    QCOMPARE(toolbarOf(*m_window).settings().map.part, KvPart::V);
    QTest::keyClick(&view, Qt::Key_K);
    QCOMPARE(toolbarOf(*m_window).settings().map.part, KvPart::K);
    QTest::keyClick(&view, Qt::Key_2);
    QCOMPARE(toolbarOf(*m_window).settings().map.metric, HeatmapMetric::RelL2);
    // 5, BC vs noise: off here (a token has 4 heads x 32 = 128 values, too few for a BC to mean
    // anything), and its entry says why; 6, the reference tool's BC, is on.
    QTest::keyClick(&view, Qt::Key_5);
    QCOMPARE(toolbarOf(*m_window).settings().map.metric, HeatmapMetric::RelL2);
    const auto* metrics = qobject_cast<QStandardItemModel*>(toolbarOf(*m_window).findChild<QComboBox*>("metric")->model());
    QVERIFY(metrics);
    const QStandardItem* bcVsNoise = metrics->item(toolbarOf(*m_window).findChild<QComboBox*>("metric")->findData(int(HeatmapMetric::BcVsNoise)));
    QVERIFY(!bcVsNoise->isEnabled());
    QVERIFY2(bcVsNoise->toolTip().contains("128 values"), qPrintable(bcVsNoise->toolTip()));
    QTest::keyClick(&view, Qt::Key_6);
    QCOMPARE(toolbarOf(*m_window).settings().map.metric, HeatmapMetric::Bc);
    QTest::keyClick(&view, Qt::Key_PageDown, Qt::ControlModifier);
    QCOMPARE(toolbarOf(*m_window).promptBox().currentIndex(), 1);
    QTest::keyClick(&view, Qt::Key_PageUp, Qt::ControlModifier);
    QCOMPARE(toolbarOf(*m_window).promptBox().currentIndex(), 0);
    // F6 goes panel to panel in one press (map, heads, suspects, worst cells, back to the map);
    // Esc in a panel goes back to the map, the cell kept.
    QListWidget& suspects = promptPageOf(*m_window).suspectsView();
    promptPageOf(*m_window).selectCell(5, 50);
    view.setFocus();
    QTRY_VERIFY(view.hasFocus());
    for (QWidget* next : std::initializer_list<QWidget*>{&heads, &suspects, &worst, &view}) {
        QTest::keyClick(QApplication::focusWidget(), Qt::Key_F6);
        QTRY_VERIFY2(next->hasFocus(), qPrintable(QApplication::focusWidget()->metaObject()->className()));
    }
    QTest::keyClick(QApplication::focusWidget(), Qt::Key_F6, Qt::ShiftModifier);
    QTRY_VERIFY(worst.hasFocus());
    for (QWidget* panel : std::initializer_list<QWidget*>{&heads, &suspects, &worst}) {
        panel->setFocus();
        QTRY_VERIFY(panel->hasFocus());
        QTest::keyClick(panel, Qt::Key_Escape);
        QTRY_VERIFY(view.hasFocus());
        QCOMPARE(promptPageOf(*m_window).selectedLayer(), 5);
    }
    // Ctrl+3 / Ctrl+4: the What if and Compare pages; Ctrl+1 back.
    QTabWidget& tabs = *m_window->findChild<QTabWidget*>();
    QTest::keyClick(&view, Qt::Key_3, Qt::ControlModifier);
    QCOMPARE(tabs.currentIndex(), 2);
    QTest::keyClick(tabs.currentWidget(), Qt::Key_4, Qt::ControlModifier);
    QCOMPARE(tabs.currentIndex(), 3);
    QTest::keyClick(tabs.currentWidget(), Qt::Key_1, Qt::ControlModifier);
    QCOMPARE(tabs.currentIndex(), 0);
}

void TestPromptPage::colourRangeComesFromTheData()
{
    ensureDemoOpen();
    toolbarOf(*m_window).setMetric(HeatmapMetric::RelL2);
    toolbarOf(*m_window).setPart(KvPart::V);
    // Default: up to twice the 99th percentile of the dtype noise (max over heads of base V L2).
    const PromptAnalysis& p = m_reference.prompts[0];
    const double expectUpper = 2 * percentile99OfCellMaxima(p, Metric::BaseVL2);
    waitForMap(*m_window);
    const QCPRange range = heatmapOf(*m_window).colorScale()->dataRange();
    QVERIFY2(std::abs(range.upper - expectUpper) <= 1e-6 * expectUpper, qPrintable(QString("%1 vs %2").arg(range.upper).arg(expectUpper)));
    QCOMPARE(range.lower, 0.0);
    QVERIFY(expectUpper < 0.1);  // far below the reference tool's fixed 0.2: the noise is visible
    // Log with a lower bound of 0: the scale starts at a positive value from the data.
    ViewSettings s = toolbarOf(*m_window).settings();
    s.autoRange = false;
    s.range = {0.0, 0.2};
    s.logarithmic = true;
    promptPageOf(*m_window).applyView(s, false);
    waitForMap(*m_window);
    const QCPRange log = heatmapOf(*m_window).colorScale()->dataRange();
    QVERIFY(log.lower > 0 && log.lower < 0.2);
    QCOMPARE(heatmapOf(*m_window).colorScale()->axis()->scaleType(), QCPAxis::stLogarithmic);
    promptPageOf(*m_window).applyView(toolbarOf(*m_window).settings(), false);
    toolbarOf(*m_window).setPart(KvPart::K);
}

void TestPromptPage::tooltipUsesTokenTextAndDivergenceBounds()
{
    ensureDemoOpen();
    const PromptAnalysis& p = m_reference.prompts[0];
    const PromptInfo& info = m_reader->prompt(p.id);
    QVERIFY(!info.tokenStrings.empty());
    const QString tip = promptPageOf(*m_window).cellTooltip(3, 12);
    QVERIFY2(tip.contains("'" + QString::fromStdString(info.tokenStrings[12]) + "'"), qPrintable(tip));
    const Divergence& d = p.divergences.at(0);
    const QString atDivergence = promptPageOf(*m_window).cellTooltip(3, d.position);
    QVERIFY2(atDivergence.contains("divergence"), qPrintable(atDivergence));
    if (d.inBounds)
        QVERIFY(atDivergence.contains(*d.inBounds ? "within the bf16 bound" : "beyond the bf16 bound"));
}

void TestPromptPage::twoWayCaptureRanksByError()
{
    SyntheticCaptureOptions o = demoCaptureOptions();
    o.baseline = false;
    const QString path = m_dir.filePath("two-way.h5");
    writeSyntheticCapture(path.toStdString(), o);
    const AnalysisResult reference = analyzeBundle(std::make_shared<BundleReader>(path.toStdString()));
    MainWindow window;
    QVERIFY(showAndAnalyse(window, path));
    // In floors by default, two-way too: a cell's relative L2 over bf16's rounding (2^-8), drawn in
    // units of the layer's off threshold, drift included.
    QCOMPARE(toolbarOf(window).settings().map.metric, HeatmapMetric::ErrorRatio);
    waitForMap(window);
    for (auto [layer, token] : {std::pair{1, qint64(10)}, std::pair{5, qint64(50)}, std::pair{7, qint64(55)}}) {
        double worst = std::nan("");
        for (int h = 0; h < reference.prompts[0].heads; ++h)
            if (const double v = reference.prompts[0].value(Metric::KL2, layer, token, h); !(v <= worst))
                worst = v;
        const double expect = worst / std::ldexp(1.0, -8) / offThresholdByFormula(reference.prompts[0], layer);
        const double got = heatmapOf(window).grid().at(layer, token);
        QVERIFY2(std::isfinite(expect) && sameTo4Digits(got, expect),
                 qPrintable(QString("%1 vs %2").arg(heatmapOf(window).grid().at(layer, token)).arg(expect)));
    }
    toolbarOf(window).setMetric(HeatmapMetric::RelLinf);
    const PromptAnalysis& p = reference.prompts[0];
    // The worst cells rank by the number the map colours: the worst head's L2 over 2^-8, shown
    // with that L2 and that floor (a large L-inf in one element, the drift's way, ranks low).
    WorstCellsModel& list = promptPageOf(window).worstCells();
    QVERIFY(list.rowCount() > 0);
    double previous = 1e300;
    for (int r = 0; r < list.rowCount(); ++r) {
        const WorstCell& c = list.cell(r);
        double worst = -1;
        for (int h = 0; h < p.heads; ++h)
            worst = std::max(worst, double(p.value(c.part == KvPart::K ? Metric::KL2 : Metric::VL2, c.layer, c.token, h)));
        const double shown = list.data(list.index(r, 3)).toString().toDouble();
        QVERIFY(sameTo4Digits(shown, worst / std::ldexp(1.0, -8)));
        QVERIFY(sameTo4Digits(list.data(list.index(r, 4)).toString().toDouble(), worst));
        const QString tip = list.data(list.index(r, 4), Qt::ToolTipRole).toString();
        QVERIFY2(tip.contains(QString("noise floor %1 =").arg(std::ldexp(1.0, -8), 0, 'g', 4)), qPrintable(tip));
        QVERIFY(shown <= previous * (1 + 5e-4));
        previous = shown;
    }
    QCOMPARE(list.headerData(4, Qt::Horizontal).toString(), QString("L2"));
    QCOMPARE(list.columnCount(), 5);
    promptPageOf(window).selectCell(5, 50);
    QVERIFY(std::isnan(headTableOf(window).value(0, HeadTableModel::ratioColumn(KvPart::K))));
    // The colour range: up to the 99th percentile of the shown values.
    const double expect = percentile99OfCellMaxima(p, Metric::KLinf);
    waitForMap(window);
    QVERIFY(std::abs(heatmapOf(window).colorScale()->dataRange().upper - expect) <= 1e-6 * expect);
}

void TestPromptPage::suspectsLeadToTheBug()
{
    ensureDemoOpen();
    const PromptAnalysis& p = m_reference.prompts[0];
    QVERIFY(!p.suspects.empty());
    const Suspect& s = p.suspects.front();
    // The demo's fault: layer 5, head 1, from token 46.
    QCOMPARE(s.firstLayer, std::string("model.layers.5.self_attn"));
    QVERIFY(std::find(s.heads.begin(), s.heads.end(), 1) != s.heads.end());
    QListWidget& list = promptPageOf(*m_window).suspectsView();
    QCOMPARE(list.count(), int(p.suspects.size()));
    list.setCurrentRow(-1);
    promptPageOf(*m_window).selectCell(0, 0);
    list.setCurrentRow(0);
    QCOMPARE(promptPageOf(*m_window).selectedLayer(), s.worstLayer);
    QCOMPARE(promptPageOf(*m_window).selectedToken(), s.worstToken);
    QCOMPARE(toolbarOf(*m_window).settings().map.part, s.worstPart);
    QCOMPARE(promptPageOf(*m_window).drillDown().head(), s.worstHead);
    QCOMPARE(promptPageOf(*m_window).suspectEvidence(), QString::fromStdString(s.evidence));
    QVERIFY(heatmapOf(*m_window).hasHighlight());
    for (int h = 0; h < p.heads; ++h)
        QCOMPARE(headTableOf(*m_window).isHighlighted(h), std::find(s.heads.begin(), s.heads.end(), h) != s.heads.end());
    // The row shows the explanation and the score.
    QVERIFY2(list.item(0)->text().contains(QString::fromStdString(s.hypothesis.kind)) && list.item(0)->text().contains("floors"),
             qPrintable(list.item(0)->text()));
    // Elsewhere, a click on the suspect already chosen goes back to its cell. The marked heads
    // stay marked (they are the suspect's, not the cell's), and say so under the table.
    promptPageOf(*m_window).selectCell(0, 0);
    for (int h = 0; h < p.heads; ++h)
        QCOMPARE(headTableOf(*m_window).isHighlighted(h), std::find(s.heads.begin(), s.heads.end(), h) != s.heads.end());
    const QLabel* marks = drillDownOf(*m_window).findChild<QLabel*>("headMarks");
    QVERIFY(marks && marks->isVisible());
    QVERIFY2(marks->text().contains("the suspect's heads") && marks->text().contains("model.layers.5"), qPrintable(marks->text()));
    QCOMPARE(list.currentRow(), 0);
    const QRect row = list.visualItemRect(list.item(0));
    QTest::mouseClick(list.viewport(), Qt::LeftButton, {}, row.center());
    QCOMPARE(promptPageOf(*m_window).selectedLayer(), s.worstLayer);
    QCOMPARE(promptPageOf(*m_window).selectedToken(), s.worstToken);
    QVERIFY(heatmapOf(*m_window).hasHighlight());
}

void TestPromptPage::enterGoesToTheHeadTable()
{
    ensureDemoOpen();
    HeatmapView& view = heatmapOf(*m_window);
    QTableView& heads = drillDownOf(*m_window).headView();
    promptPageOf(*m_window).selectCell(5, 50);
    view.setFocus();
    QTRY_VERIFY(view.hasFocus());
    QTest::keyClick(&view, Qt::Key_Return);
    QTRY_VERIFY(heads.hasFocus());
    // on the row of the head the drill-down shows (the cell's worst)
    const int shown = drillDownOf(*m_window).head();
    QCOMPARE(heads.model()->headerData(heads.currentIndex().row(), Qt::Vertical).toString().remove(" *"), QString("head %1").arg(shown));
    view.setFocus();
    QTRY_VERIFY(view.hasFocus());
    QTest::keyClick(&view, Qt::Key_Enter);  // the keypad's too
    QTRY_VERIFY(heads.hasFocus());
}

void TestPromptPage::tabbingIntoWorstCellsKeepsTheCell()
{
    ensureDemoOpen();
    PromptPage& page = promptPageOf(*m_window);
    QTableView& worst = page.worstCellsView();
    // A cell chosen on the map (not in the list), then the focus moves to the list by Tab.
    toolbarOf(*m_window).setPrompt(1);
    toolbarOf(*m_window).setPrompt(0);  // the list afresh: nothing current in it
    page.selectCell(2, 10);
    QVERIFY(page.worstCells().rowCount() > 1);
    const WorstCell first = page.worstCells().cell(0);
    QVERIFY(first.layer != 2 || first.token != 10);
    QWidget* before = worst.previousInFocusChain();
    while (before && !(before->focusPolicy() & Qt::TabFocus))
        before = before->previousInFocusChain();
    QVERIFY(before);
    before->setFocus(Qt::TabFocusReason);
    QTRY_VERIFY(before->hasFocus());
    QTest::keyClick(before, Qt::Key_Tab);
    QTRY_VERIFY(worst.hasFocus());
    QCOMPARE(page.selectedLayer(), 2);
    QCOMPARE(page.selectedToken(), qint64(10));
    // The keyboard then moves in the list, and the cell follows it.
    QTest::keyClick(&worst, Qt::Key_Down);
    const int row = worst.currentIndex().row();
    QVERIFY(row >= 0);
    QCOMPARE(page.selectedLayer(), page.worstCells().cell(row).layer);
    QCOMPARE(page.selectedToken(), page.worstCells().cell(row).token);
}

void TestPromptPage::doubleClickOnlyResetsTheZoom()
{
    ensureDemoOpen();
    HeatmapView& view = heatmapOf(*m_window);
    PromptPage& page = promptPageOf(*m_window);
    view.resetZoom();
    page.selectCell(2, 20);
    view.xAxis->setRange(10, 30);
    view.replot(QCustomPlot::rpImmediateRefresh);
    const QPoint at(int(view.xAxis->coordToPixel(25)), int(view.yAxis->coordToPixel(6)));
    QTest::mouseDClick(&view, Qt::LeftButton, {}, at);
    QCOMPARE(view.xAxis->range().size(), double(m_reference.prompts[0].tokens));
    QTest::qWait(QApplication::doubleClickInterval() + 200);  // past the time a click waits
    QCOMPARE(page.selectedLayer(), 2);
    QCOMPARE(page.selectedToken(), qint64(20));
}

// 40 layers in a short map: only some rows can be labelled, but always the selected one and
// the suspect's.
void TestPromptPage::selectedAndSuspectRowsKeepTheirLabels()
{
    SyntheticCaptureOptions o = demoCaptureOptions();
    o.layers = 40;
    o.faultLayer = 23;  // an odd row: not among every other label
    const QString path = m_dir.filePath("forty.h5");
    writeSyntheticCapture(path.toStdString(), o);
    const AnalysisResult reference = analyzeBundle(std::make_shared<BundleReader>(path.toStdString()));
    QVERIFY(!reference.prompts[0].suspects.empty());
    const Suspect& suspect = reference.prompts[0].suspects.front();
    MainWindow window;
    window.resize(1024, 700);
    window.show();
    QSignalSpy finished(&window.controller(), &AnalysisController::finished);
    window.openPath(path);
    QVERIFY(finished.wait(60000));
    QCoreApplication::processEvents();
    HeatmapView& view = heatmapOf(window);
    auto labelled = [&] {
        view.replot(QCustomPlot::rpImmediateRefresh);
        QList<int> rows;
        const auto ticker = qSharedPointerDynamicCast<QCPAxisTickerText>(view.yAxis->ticker());
        for (auto it = ticker->ticks().constBegin(); it != ticker->ticks().constEnd(); ++it)
            rows << int(it.key());
        return rows;
    };
    QVERIFY2(labelled().size() < 40, "every row fits: the test needs a map too short for 40 labels");
    // The suspect is followed at the start: its rows are labelled.
    QVERIFY(labelled().contains(suspect.worstLayer));
    const auto first = std::find(reference.prompts[0].layers.begin(), reference.prompts[0].layers.end(), suspect.firstLayer);
    QVERIFY(labelled().contains(int(first - reference.prompts[0].layers.begin())));
    // Each selected row is labelled, wherever it is; no label is closer than a line height.
    const int lineHeight = QFontMetrics(view.yAxis->tickLabelFont()).height();
    for (int row : {1, 2, 3, 17, 38, 39}) {
        promptPageOf(window).selectCell(row, 30);
        const QList<int> rows = labelled();
        QVERIFY2(rows.contains(row), qPrintable(QString("row %1 not labelled").arg(row)));
        QVERIFY(rows.contains(suspect.worstLayer));
        QList<double> pixels;
        for (int r : rows)
            pixels << view.yAxis->coordToPixel(r);
        std::sort(pixels.begin(), pixels.end());
        for (int i = 1; i < pixels.size(); ++i)
            QVERIFY2(pixels[i] - pixels[i - 1] >= lineHeight - 1, qPrintable(QString("labels overlap near row %1").arg(row)));
    }
}

void TestPromptPage::tokenLabelsDoNotOverlap()
{
    ensureDemoOpen();
    HeatmapView& view = heatmapOf(*m_window);
    QSplitter& split = promptPageOf(*m_window);
    const QList<int> sizes = split.sizes();
    for (int width : {1000, 500}) {  // a wide map and a narrow one
        split.setSizes({width, 1400});
        QCoreApplication::processEvents();
        for (double span : {38.0, 20.0, 8.0}) {  // zoomed in: token text on the axis
            view.xAxis->setRange(10, 10 + span);
            view.replot(QCustomPlot::rpImmediateRefresh);
            const auto ticker = qSharedPointerDynamicCast<QCPAxisTickerText>(view.xAxis->ticker());
            QVERIFY(ticker && !ticker->ticks().isEmpty());
            QVERIFY2(!tickLabelsOverlap(view.xAxis), qPrintable(QString("width %1, %2 tokens").arg(width).arg(span)));
        }
    }
    split.setSizes(sizes);
    view.resetZoom();
}

void TestPromptPage::tooltipNamesItsBc()
{
    ensureDemoOpen();
    const PromptAnalysis& p = m_reference.prompts[0];
    const QString tip = promptPageOf(*m_window).cellTooltip(5, 50);
    QVERIFY2(sameTo4Digits(numberAfter(tip, "BC vs noise floor: K"), p.bcVsNoiseValue(KvPart::K, 5, 50)), qPrintable(tip));
    QVERIFY2(sameTo4Digits(numberAfter(tip, ", V"), p.bcVsNoiseValue(KvPart::V, 5, 50)), qPrintable(tip));
}

QTEST_MAIN(TestPromptPage)
// A model capture with its impact record: the suspect's row says its impact short, its sentence
// under the evidence is the analysis's, and the column beside the map has the prompt's layers,
// the fault's beyond its noise; without a record, the column is not shown.
void TestPromptPage::impactInTheSuspectRowAndBesideTheMap()
{
    synth::ModelCaptureOptions o = kvtest::smallModel(synth::FaultKind::RopeOffset);
    o.impactSchemes.clear();
    const QString path = m_dir.filePath("impact.h5");
    const AnalysisResult reference = kvtest::analyseModelCapture(path.toStdString(), o);
    const PromptAnalysis& p = reference.prompts.at(0);
    QVERIFY(!p.suspects.empty() && p.suspects.front().impact);
    const SuspectImpact& impact = *p.suspects.front().impact;
    MainWindow window;
    window.resize(1024, 700);
    window.show();
    QSignalSpy finished(&window.controller(), &AnalysisController::finished);
    window.openPath(path);
    QVERIFY(finished.wait(60000));
    QCoreApplication::processEvents();
    PromptPage& page = promptPageOf(window);
    QListWidget& list = page.suspectsView();
    QVERIFY2(list.item(0)->text().endsWith(QString::fromStdString(impactShortText(impact))), qPrintable(list.item(0)->text()));
    QVERIFY(list.item(0)->toolTip().contains(QString::fromStdString(impact.text).toHtmlEscaped()));
    list.setCurrentRow(-1);
    list.setCurrentRow(0);
    QCOMPARE(page.suspectImpact(), "Output: " + QString::fromStdString(impact.text));
    ImpactColumn& column = page.impactColumn();
    QVERIFY(column.isVisible());
    const int fault = int(std::find(p.layers.begin(), p.layers.end(), p.suspects.front().firstLayer) - p.layers.begin());
    QVERIFY(fault < int(p.layers.size()));
    const QString tip = column.describeAt(int(column.barRect(fault).center().y()));
    QVERIFY2(tip.contains(QString::fromStdString(p.suspects.front().firstLayer)), qPrintable(tip));
    const std::vector<LayerImpact> layers = layerImpacts(reference.prompts, {p.id}, p.layers);
    QCOMPARE(impactLevel(layers[std::size_t(fault)]), ImpactLevel::AboveNoise);
    QVERIFY2(tip.contains(QString::fromStdString(layerImpactLines(layers[std::size_t(fault)]).front()).toHtmlEscaped()),
             qPrintable(tip));

    o.impact = false;
    const QString plain = m_dir.filePath("no-impact.h5");
    synth::writeModelCapture(plain.toStdString(), o);
    window.openPath(plain);
    QVERIFY(finished.wait(60000));
    QCoreApplication::processEvents();
    QVERIFY(!column.isVisible());
    QVERIFY(!list.item(0)->text().contains("output:"));
    QVERIFY(page.suspectImpact().isEmpty());
}

#include "tst_gui_prompt_page.moc"
