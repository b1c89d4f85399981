// The drill-down under the map: the heads table (through QAbstractItemModelTester too), the
// head's error histograms, the metric across the sequence.

#include "gui_test_support.h"

#include "gui/head_table_model.h"
#include "gui/worst_cells_model.h"
#include "widgets/histogram_view.h"
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
#include <QListWidget>
#include <QScrollBar>
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

class TestDrillDown : public GuiSuite {
    Q_OBJECT

private slots:
    void initTestCase() { initDemo(); }
    void modelsPassTheTester();
    void panelsFollowThePromptAndKeepTheHead();
    void histogramAxesFitTheData();
    void linePlotShowsAllItsData();
    void headsAreSortedByThePartShown();
    void lineTicksDoNotRunTogether();
    void histogramNamesItsBc();
    void cellWithoutDataSaysSo();
    void emptyPanelTitlesWrap();
};

void TestDrillDown::modelsPassTheTester()
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

void TestDrillDown::panelsFollowThePromptAndKeepTheHead()
{
    ensureDemoOpen();
    toolbarOf(*m_window).setMetric(HeatmapMetric::RelLinf);
    promptPageOf(*m_window).selectCell(5, 50);
    DrillDownPanel& drill = promptPageOf(*m_window).drillDown();
    // A head chosen in the table stays through metric and K/V switches.
    drill.showHead(2);
    QCOMPARE(drill.head(), 2);
    toolbarOf(*m_window).setMetric(HeatmapMetric::RelL2);
    toolbarOf(*m_window).setPart(KvPart::V);
    toolbarOf(*m_window).setMetric(HeatmapMetric::ErrorRatio);
    QCOMPARE(drill.head(), 2);
    QCOMPARE(promptPageOf(*m_window).selectedLayer(), 5);
    toolbarOf(*m_window).setPart(KvPart::K);
    // Another prompt: every panel shows a cell of that prompt (its worst), none of the old one.
    QSignalSpy histogram(&drillDownOf(*m_window), &DrillDownPanel::histogramShown);
    toolbarOf(*m_window).setPrompt(1);
    const PromptAnalysis& p1 = m_reference.prompts[1];
    const std::vector<WorstCell> worst = worstCells(p1, 1);
    QCOMPARE(promptPageOf(*m_window).selectedLayer(), worst[0].layer);
    QCOMPARE(promptPageOf(*m_window).selectedToken(), worst[0].token);
    const QCPGraph* line = drill.line().graph(0);
    QCOMPARE(line->dataCount(), int(p1.tokens));
    for (int t = 0; t < int(p1.tokens); t += 7) {
        const double expect = p1.value(worst[0].part == KvPart::K ? Metric::KLinf : Metric::VLinf, worst[0].layer, t, drill.head());
        QVERIFY(std::isnan(expect) ? std::isnan(line->data()->at(t)->value) : line->data()->at(t)->value == expect);
    }
    QVERIFY(histogram.wait(20000) || histogram.count() > 0);
    QVERIFY(drill.histogram().hasHistogram());
    // Nothing selected: the panels say so rather than show the last cell.
    promptPageOf(*m_window).clearSelection();
    QVERIFY(!drill.histogram().hasHistogram());
    QCOMPARE(drill.line().graph(0)->dataCount(), 0);
    QCOMPARE(headTableOf(*m_window).rowCount(), 0);
    toolbarOf(*m_window).setPrompt(0);
}

void TestDrillDown::histogramAxesFitTheData()
{
    ensureDemoOpen();
    toolbarOf(*m_window).setMetric(HeatmapMetric::ErrorRatio);
    toolbarOf(*m_window).setPart(KvPart::K);
    DrillDownPanel& drill = promptPageOf(*m_window).drillDown();
    QSignalSpy shown(&drillDownOf(*m_window), &DrillDownPanel::histogramShown);
    promptPageOf(*m_window).selectCell(5, 50);  // the faulty head: errors far beyond the noise
    QVERIFY(shown.wait(20000) || shown.count() > 0);
    HistogramView& h = drill.histogram();
    QVERIFY(h.hasHistogram());
    const PromptAnalysis& p = m_reference.prompts[0];
    const double values = double(p.dims.k);  // one token, one head
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
                    // said under the title, not drawn inside the plot over the y axis
                    QVERIFY(h.message().contains(h.apartLabel()));
                    QCOMPARE(h.itemCount(), 0);
                }
            } else {
                // Log: the bins span orders of magnitude, from the smallest positive error.
                QVERIFY(bins->edges.back() / bins->edges.front() > 10);
            }
        }
    h.setLogErrors(true);
    h.setLogCounts(false);
}

void TestDrillDown::linePlotShowsAllItsData()
{
    ensureDemoOpen();
    toolbarOf(*m_window).setMetric(HeatmapMetric::RelLinf);
    promptPageOf(*m_window).selectCell(5, 50);
    TokenLineView& line = promptPageOf(*m_window).drillDown().line();
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

// The table sorted by K's ratio is sorted by V's after a switch to V, not left in K's order.
void TestDrillDown::headsAreSortedByThePartShown()
{
    ensureDemoOpen();
    toolbarOf(*m_window).setPart(KvPart::K);
    promptPageOf(*m_window).selectCell(5, 50);
    QTableView& view = drillDownOf(*m_window).headView();
    view.sortByColumn(HeadTableModel::ratioColumn(KvPart::K), Qt::DescendingOrder);
    const PromptAnalysis& p = m_reference.prompts[0];
    // The heads in the order shown, and that order by the reference's L-inf of `part` (the
    // ratio is the L-inf over the same floor for every head of the cell).
    auto inOrderOf = [&](KvPart part) {
        const Metric m = part == KvPart::K ? Metric::KLinf : Metric::VLinf;
        double previous = 1e300;
        for (int row = 0; row < view.model()->rowCount(); ++row) {
            const int head = view.model()->headerData(row, Qt::Vertical).toString().section(' ', 1, 1).toInt();
            const double v = p.value(m, 5, 50, head);
            if (v > previous)
                return false;
            previous = v;
        }
        return true;
    };
    QVERIFY(inOrderOf(KvPart::K));
    QVERIFY(!inOrderOf(KvPart::V));  // the two orders differ in this cell: the test can tell them apart
    toolbarOf(*m_window).setPart(KvPart::V);
    QCOMPARE(view.horizontalHeader()->sortIndicatorSection(), HeadTableModel::ratioColumn(KvPart::V));
    QCOMPARE(view.horizontalHeader()->sortIndicatorOrder(), Qt::DescendingOrder);
    QVERIFY(inOrderOf(KvPart::V));
    toolbarOf(*m_window).setPart(KvPart::K);
    QVERIFY(inOrderOf(KvPart::K));
}

void TestDrillDown::lineTicksDoNotRunTogether()
{
    // A long sequence (hundreds of tokens: labels of 3-4 digits) in a narrow line plot.
    SyntheticCaptureOptions o = demoCaptureOptions();
    o.promptLens = {900};
    o.layers = 2;
    o.faultLayer = 1;
    const QString path = m_dir.filePath("long.h5");
    writeSyntheticCapture(path.toStdString(), o);
    MainWindow window;
    QVERIFY(showAndAnalyse(window, path));
    promptPageOf(window).selectCell(1, 100);
    TokenLineView& line = drillDownOf(window).line();
    for (int width : {200, 260, 400, 700}) {
        line.resize(width, line.height());
        QCoreApplication::processEvents();
        line.replot(QCustomPlot::rpImmediateRefresh);
        QVERIFY(line.xAxis->range().upper > 900);
        QVERIFY(line.xAxis->tickVector().size() >= 2);
        QVERIFY2(!tickLabelsOverlap(line.xAxis), qPrintable(QString("at %1 px: %2").arg(width).arg(QStringList(line.xAxis->tickVectorLabels().toList()).join(" "))));
    }
}

// The histogram's BC is the reference tool's, of one head: said so, and not confused with the
// map's BC vs noise floor.
void TestDrillDown::histogramNamesItsBc()
{
    ensureDemoOpen();
    toolbarOf(*m_window).setPart(KvPart::K);
    QSignalSpy shown(&drillDownOf(*m_window), &DrillDownPanel::histogramShown);
    promptPageOf(*m_window).selectCell(5, 50);
    QTRY_VERIFY_WITH_TIMEOUT(shown.count() > 0 && drillDownOf(*m_window).histogram().hasHistogram(), 20000);
    const QString title = drillDownOf(*m_window).histogram().message();
    QVERIFY2(title.contains("head ") && title.contains(" · reference tool's BC 0."), qPrintable(title));
    QVERIFY2(!title.contains("vs noise"), qPrintable(title));
    // and its error axis's labels stay apart in a narrow panel
    HistogramView& h = drillDownOf(*m_window).histogram();
    for (bool logErrors : {true, false}) {
        h.setLogErrors(logErrors);
        h.replot(QCustomPlot::rpImmediateRefresh);
        QVERIFY2(!tickLabelsOverlap(h.xAxis), qPrintable(QStringList(h.xAxis->tickVectorLabels().toList()).join(" ")));
    }
    h.setLogErrors(true);
}

// A cell that no side holds (outside a freed sliding window) says there is no data there.
void TestDrillDown::cellWithoutDataSaysSo()
{
    ensureDemoOpen();
    const PromptAnalysis& p = m_reference.prompts[0];
    int layer = -1;
    qint64 token = -1;
    for (int l = 0; l < int(p.layers.size()) && layer < 0; ++l)
        for (qint64 t = 0; t < p.tokens && layer < 0; ++t)
            if (std::isnan(p.value(Metric::KLinf, l, t, 0)))
                layer = l, token = t;
    QVERIFY2(layer >= 0, "the demo has freed sliding-window positions");
    QSignalSpy shown(&drillDownOf(*m_window), &DrillDownPanel::histogramShown);
    promptPageOf(*m_window).selectCell(layer, token);
    QTRY_VERIFY_WITH_TIMEOUT(shown.count() > 0, 20000);
    const QString title = drillDownOf(*m_window).histogram().message();
    QVERIFY2(title.contains("no data for this cell"), qPrintable(title));
    QVERIFY2(!title.contains("no errors above 0"), qPrintable(title));
}

// A message longer than a narrow panel is wide is wrapped onto lines that fit, not cut.
void TestDrillDown::emptyPanelTitlesWrap()
{
    HistogramView histogram;
    TokenLineView line;
    const QString message = "no cell selected: click the heatmap or a worst cell";
    for (QCustomPlot* plot : std::initializer_list<QCustomPlot*>{&histogram, &line}) {
        plot->resize(180, 200);
        plot->show();
        QVERIFY(QTest::qWaitForWindowExposed(plot));
        if (plot == &histogram)
            histogram.clearHistogram(message);
        else
            line.clearSeries(message);
        plot->replot(QCustomPlot::rpImmediateRefresh);
        auto* title = qobject_cast<QCPTextElement*>(plot->plotLayout()->element(0, 0));
        QVERIFY(title);
        QVERIFY(title->text().contains('\n'));
        QCOMPARE(title->text().simplified(), message);  // every word kept
        for (const QString& l : title->text().split('\n'))
            QVERIFY2(QFontMetrics(title->font()).horizontalAdvance(l) <= plot->width(), qPrintable(l));
    }
    QCOMPARE(histogram.message(), message);
}

QTEST_MAIN(TestDrillDown)
#include "tst_gui_drill_down.moc"
