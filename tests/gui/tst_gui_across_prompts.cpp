// The across-prompts page: BC vs noise by generation index, and a click that leads to the
// prompt where the cell is worst.

#include "gui_test_support.h"
#include "small_model.h"

#include "gui/head_table_model.h"
#include "gui/whatif_page.h"
#include "quant/impact_recipe.h"
#include "quant/whatif.h"
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
#include <QLabel>
#include <QListWidget>
#include <QScrollBar>
#include <QSortFilterProxyModel>
#include <QStatusBar>
#include <QTableView>
#include <QTabWidget>
#include <QPushButton>
#include <QTableWidget>
#include <QToolBar>
#include <QWheelEvent>

#include <atomic>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <future>

using namespace kvscope;
using namespace kvtest;

class TestAcrossPrompts : public GuiSuite {
    Q_OBJECT

private slots:
    void initTestCase() { initDemo(); }
    void acrossPromptsLeadsToThePrompt();
    void statusMessageGoesWithItsCell();
    void whatIfRunsInTheBackgroundAndShowsTheSameNumbers();
    void whatIfRecipeByOutput();
    void anIndexOfTooFewValuesDrawsNoBc();
};

void TestAcrossPrompts::acrossPromptsLeadsToThePrompt()
{
    ensureDemoOpen();
    m_window->showAcrossPrompts(true);
    QComboBox& prompts = toolbarOf(*m_window).promptBox();
    QVERIFY(!prompts.isEnabled());  // what does not apply there is off
    const AggregateBc& a = *m_reference.aggregate;
    // Row labels carry the attention kind.
    auto ticker = qSharedPointerDynamicCast<QCPAxisTickerText>(acrossPageOf(*m_window).heatmap().yAxis->ticker());
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
    emit acrossPageOf(*m_window).cellChosen(layer, g);
    QCOMPARE(toolbarOf(*m_window).promptBox().currentIndex(), expectPrompt);
    QVERIFY(prompts.isEnabled());
    QCOMPARE(promptPageOf(*m_window).selectedLayer(), layer);
    QCOMPARE(promptPageOf(*m_window).selectedToken(), m_reference.prompts[std::size_t(expectPrompt)].promptLen + g);
    toolbarOf(*m_window).setPrompt(0);
}

// The status bar says where a click on the across-prompts map led; switching K/V or moving to
// another cell makes that stale, and it goes back to what is open.
void TestAcrossPrompts::statusMessageGoesWithItsCell()
{
    ensureDemoOpen();
    QLabel* status = m_window->statusBar()->findChild<QLabel*>();
    QVERIFY(status);
    const QString summary = QString("demo.h5: %1 prompt(s), 8 layers analysed").arg(m_reference.prompts.size());
    promptPageOf(*m_window).selectCell(2, 2);
    QCOMPARE(status->text(), summary);
    m_window->showAcrossPrompts(true);
    emit acrossPageOf(*m_window).cellChosen(5, 3);
    QVERIFY2(status->text().contains("is worst in prompt"), qPrintable(status->text()));
    toolbarOf(*m_window).setPart(KvPart::V);
    QCOMPARE(status->text(), summary);
    toolbarOf(*m_window).setPart(KvPart::K);
    m_window->showAcrossPrompts(true);
    emit acrossPageOf(*m_window).cellChosen(5, 3);
    QVERIFY(status->text().contains("is worst in prompt"));
    promptPageOf(*m_window).selectCell(1, 1);
    QCOMPARE(status->text(), summary);
    toolbarOf(*m_window).setPrompt(0);
}

void TestAcrossPrompts::whatIfRunsInTheBackgroundAndShowsTheSameNumbers()
{
    ensureDemoOpen();
    WhatIfPage& page = partOf<WhatIfPage>(*m_window, "whatIf");
    QTabWidget& tabs = *m_window->findChild<QTabWidget*>();
    tabs.setCurrentWidget(&page);
    QTableWidget& table = partOf<QTableWidget>(*m_window, "whatIfTable");
    QPushButton& run = partOf<QPushButton>(*m_window, "whatIfRun");
    QVERIFY(run.isEnabled());
    QTest::mouseClick(&run, Qt::LeftButton);
    QVERIFY(!run.isEnabled());  // running, off the GUI thread: the window answers meanwhile
    QTRY_VERIFY_WITH_TIMEOUT(page.result() != nullptr, 60000);
    QVERIFY(run.isEnabled());
    // The same numbers as the what-if computed here, without the GUI, on the same bundle.
    const CaptureLoader loader(m_reader);
    WhatIfOptions options;
    options.schemes = allSchemes();
    const WhatIfResult expected = runWhatIf(loader, options);
    QCOMPARE(table.rowCount(), int(expected.layers.size()));
    QCOMPARE(table.columnCount(), int(expected.schemes.size()) + 1);
    table.sortByColumn(0, Qt::AscendingOrder);
    for (int l = 0; l < table.rowCount(); ++l)
        for (int s = 0; s < int(expected.schemes.size()); ++s) {
            const WhatIfLayer& x = expected.schemes[std::size_t(s)].layers[std::size_t(l)];
            const QString text = table.item(l, s + 1)->text();
            QVERIFY2(text.startsWith(QString("%1 / %2").arg(x.floorRatioMedian[0], 0, 'f', 1).arg(x.floorRatioMedian[1], 0, 'f', 1)),
                     qPrintable(text));
            QCOMPARE(text.contains("hurt"), x.hurt);
        }
    // (The demo here measured no impact: no recipe by output.)
    QVERIFY(!partOf<QLabel>(*m_window, "whatIfVerdicts").text().contains("By output"));
    // Sorting by a scheme's column orders the rows by its number, not its text.
    table.sortByColumn(1, Qt::DescendingOrder);
    for (int r = 1; r < table.rowCount(); ++r)
        QVERIFY(table.item(r - 1, 1)->data(Qt::UserRole).toDouble() >= table.item(r, 1)->data(Qt::UserRole).toDouble());
    tabs.setCurrentIndex(0);
}

// A capture that measured its schemes' impact on the output: the what-if's verdicts start with
// the recipe those measurements propose (read from the analysis once it has ended).
void TestAcrossPrompts::whatIfRecipeByOutput()
{
    const QString path = m_dir.filePath("quiet-heads.h5");
    const AnalysisResult reference = analyseModelCapture(path.toStdString(), quietHeadModel());
    std::vector<const ImpactRecord*> records;
    for (const PromptAnalysis& p : reference.prompts)
        if (p.impact)
            records.push_back(&*p.impact);
    const std::optional<ImpactRecipe> recipe = recipeForMeasured(records, reference.prompts.at(0).layers);
    QVERIFY(recipe);
    MainWindow window;
    QVERIFY(showAndAnalyse(window, path));
    WhatIfPage& page = partOf<WhatIfPage>(window, "whatIf");
    window.findChild<QTabWidget*>()->setCurrentWidget(&page);
    QTest::mouseClick(&partOf<QPushButton>(window, "whatIfRun"), Qt::LeftButton);
    QTRY_VERIFY_WITH_TIMEOUT(page.result() != nullptr, 60000);
    const QString verdicts = partOf<QLabel>(window, "whatIfVerdicts").text();
    QVERIFY2(verdicts.contains("By output") && verdicts.contains(QString::fromStdString(recipe->text).toHtmlEscaped()),
             qPrintable(verdicts));
}

// Two prompts of a 2-head x 16-dim model pool 64 values at a generation index: two draws of the
// same noise already give a BC far from 1, so the map draws none and says why. Two prompts of
// 4 heads x 128 dims pool 1,024: drawn.
void TestAcrossPrompts::anIndexOfTooFewValuesDrawsNoBc()
{
    SyntheticCaptureOptions o = demoCaptureOptions();
    o.layers = 2;
    o.kvHeads = 2;
    o.headDim = 16;
    o.promptLens = {24, 30};
    o.decodeTokens = 6;
    o.divergence = -1;
    const QString path = m_dir.filePath("small-heads.h5");
    writeSyntheticCapture(path.toStdString(), o);
    MainWindow window;
    QVERIFY(showAndAnalyse(window, path));
    window.showAcrossPrompts(true);
    QTRY_VERIFY(acrossPageOf(window).unavailable().isEmpty());
    const HeatmapGrid& grid = acrossPageOf(window).heatmap().grid();
    QCOMPARE(grid.columns, qint64(6));
    QVERIFY(std::all_of(grid.values.begin(), grid.values.end(), [](float v) { return std::isnan(v); }));
    const QString title = acrossPageOf(window).heatmap().titleText();
    QVERIFY2(title.contains("not drawn, an index pools 64 values (2 prompt(s))") && title.contains("at least 1000"),
             qPrintable(title));
    // The BCs were computed (the JSON has them); only the map leaves them out.
    const AnalysisResult& small = *window.controller().result();
    QVERIFY(std::any_of(small.aggregate->bcVsNoise[0].begin(), small.aggregate->bcVsNoise[0].end(),
                        [](float v) { return !std::isnan(v); }));

    o.kvHeads = 4;
    o.headDim = 128;
    const std::string enough = m_dir.filePath("enough.h5").toStdString();
    writeSyntheticCapture(enough, o);
    const AnalysisResult drawn = analyzeBundle(std::make_shared<BundleReader>(enough));
    QCOMPARE(smallestGenerationValues(drawn), std::int64_t(1024));
    const HeatmapGrid map = aggregateHeatmap(drawn, KvPart::K);
    const std::vector<float>& bcs = drawn.aggregate->bcVsNoise[0];
    QVERIFY(map.values.size() == bcs.size() &&
            std::memcmp(map.values.data(), bcs.data(), bcs.size() * sizeof(float)) == 0);  // (NaN where no data)
    QVERIFY(std::any_of(map.values.begin(), map.values.end(), [](float v) { return !std::isnan(v); }));
}

QTEST_MAIN(TestAcrossPrompts)
#include "tst_gui_across_prompts.moc"
