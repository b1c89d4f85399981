// The Compare page (File > Compare with...) under QT_QPA_PLATFORM=offscreen: the open bundle
// (B, the demo with its RoPE fault) against a clean capture of the same prompts (A), off the
// GUI thread; the regressions first in the table, the B - A map equal to the cell ratios
// recomputed here from both analyses, A and B side by side for a clicked cell; a capture of
// other prompts is a message, and a comparison left running when another bundle opens is
// dropped. In transfer mode, an engine-only consumer against its producer: the block that holds
// another request's KV found, named and drawn where it was put.

#include "gui_test_support.h"

#include "gui/compare_page.h"
#include "gui/transfer_view.h"
#include "transfer/transfer_map.h"
#include "transfer_pair.h"
#include "widgets/heatmap_view.h"

#include <QLabel>
#include <QSignalSpy>
#include <QTableWidget>

using namespace kvscope;
using namespace kvtest;

class TestCompare : public GuiSuite {
    Q_OBJECT

private slots:
    void initTestCase()
    {
        initDemo();
        SyntheticCaptureOptions clean = demoCaptureOptions();
        m_faultLayer = clean.faultLayer;
        clean.faultLayer = -1;
        m_clean = m_dir.filePath("clean.h5");
        writeSyntheticCapture(m_clean.toStdString(), clean);
        m_cleanResult = analyzeBundle(std::make_shared<BundleReader>(m_clean.toStdString()));
    }
    void regressionsFirstAndTheMapIsBMinusA();
    void aCellShowsAAndBSideBySide();
    void otherPromptsAreAMessage();
    void transferModeShowsWhatArrived();

private:
    ComparePage& page() { return m_window->comparePage(); }
    void compare(const QString& path)
    {
        ensureDemoOpen();
        QSignalSpy done(&page(), &ComparePage::comparisonFinished);
        m_window->compareWith(path);
        QVERIFY(done.wait(60000));
    }

    int m_faultLayer = 0;
    QString m_clean;
    AnalysisResult m_cleanResult;
};

void TestCompare::regressionsFirstAndTheMapIsBMinusA()
{
    compare(m_clean);
    QVERIFY(page().result());
    QCOMPARE(page().result()->verdict(), Change::Worse);
    auto* table = page().findChild<QTableWidget*>("compareTable");
    QVERIFY(table && table->rowCount() > 0);
    const std::string faulty = "model.layers." + std::to_string(m_faultLayer) + ".self_attn";
    QCOMPARE(table->item(0, 0)->toolTip().toStdString(), faulty);  // (the row: its short name, as the map's)
    QCOMPARE(table->item(0, 1)->text(), QString("worse"));
    // Beside the verdict, the level its statistic had to pass: the largest of the matched
    // prompts' off thresholds, by the formula (three-way: the same for every layer).
    double level = 0;
    for (const PromptAnalysis& p : m_reference.prompts)
        level = std::max(level, offThresholdByFormula(p, m_faultLayer, 1.0));
    QVERIFY2(sameTo4Digits(table->item(0, 4)->text().toDouble(), level) ||
                 std::abs(table->item(0, 4)->text().toDouble() - level) < 0.005 * level,  // (shown to 3 digits)
             qPrintable(table->item(0, 4)->text() + " vs " + QString::number(level)));
    QVERIFY(table->horizontalHeaderItem(2)->text().contains("(max)"));
    // The map shown: B - A of the first regression's part, in every cell.
    const HeatmapGrid& grid = page().heatmap().grid();
    const PromptAnalysis& b = m_reference.prompts.front();
    const PromptAnalysis& a = m_cleanResult.prompts.front();
    const KvPart part = page().result()->firstWorse->part;
    QCOMPARE(grid.columns, b.tokens);
    int checked = 0;
    for (int l = 0; l < grid.rows; ++l)
        for (qint64 t = 0; t < grid.columns; ++t) {
            const double expected = referenceRatio(b, part, l, t) - referenceRatio(a, part, l, t);
            const float shown = grid.at(l, t);
            if (std::isnan(expected)) {
                QVERIFY(std::isnan(shown));
                continue;
            }
            QVERIFY2(std::fabs(shown - expected) <= 1e-4 * std::max(1.0, std::fabs(expected)),
                     qPrintable(QString("layer %1 token %2: %3 against %4").arg(l).arg(t).arg(shown).arg(expected)));
            ++checked;
        }
    QVERIFY(checked > 100);
    // Everything before the fault's layer is unchanged, in the map too.
    for (int l = 0; l < m_faultLayer; ++l)
        for (qint64 t = 0; t < grid.columns; ++t)
            QVERIFY(std::isnan(grid.at(l, t)) || grid.at(l, t) == 0.0f);
}

void TestCompare::aCellShowsAAndBSideBySide()
{
    compare(m_clean);
    const CellMove first = *page().result()->firstWorse;
    auto* table = page().findChild<QTableWidget*>("compareTable");
    emit table->cellClicked(0, 0);  // the first regression: its first worse cell
    QLabel* cell = nullptr;
    for (QLabel* label : page().findChildren<QLabel*>())
        if (label->text().contains("B - A"))
            cell = label;
    QVERIFY(cell);
    const PromptAnalysis& b = m_reference.prompts.front();
    const PromptAnalysis& a = m_cleanResult.prompts.front();
    QCOMPARE(first.layer, m_faultLayer);
    const double ra = referenceRatio(a, first.part, first.layer, first.token);
    const double rb = referenceRatio(b, first.part, first.layer, first.token);
    QVERIFY2(std::fabs(numberAfter(cell->text(), "<br>A ") - ra) <= 0.05 * ra + 0.01, qPrintable(cell->text()));
    QVERIFY2(std::fabs(numberAfter(cell->text(), "&nbsp; B ") - rb) <= 0.05 * rb, qPrintable(cell->text()));
    QVERIFY(cell->text().contains(QString("token %1").arg(first.token)));
}

void TestCompare::otherPromptsAreAMessage()
{
    SyntheticCaptureOptions other = demoCaptureOptions();
    other.seed += 17;
    const QString path = m_dir.filePath("other.h5");
    writeSyntheticCapture(path.toStdString(), other);
    compare(path);
    QVERIFY(!page().result());
    QString text;
    for (QLabel* label : page().findChildren<QLabel*>())
        text += label->text();
    QVERIFY2(text.contains("Could not compare") && text.contains("different prompts"), qPrintable(text));

    // A comparison still running when another bundle opens is dropped with the old bundle.
    ensureDemoOpen();
    m_window->compareWith(m_clean);
    openDemo();
    QTest::qWait(300);
    QVERIFY(!page().result());
}

void TestCompare::transferModeShowsWhatArrived()
{
    // Two requests of 40 positions; the consumer's blocks elsewhere, and its request p1 holding
    // p0's block 1 (positions 16-31) in layer 1: a key collision.
    const TransferShape shape;
    const Side producer = makeSide(shape, 2, 40, 0);
    Side consumer = makeSide(shape, 2, 40, 20);
    for (int part = 0; part < 2; ++part)
        for (int head = 0; head < shape.heads; ++head)
            for (int r = 0; r < shape.blockSize; ++r)
                std::copy_n(consumer.prompts[0].row(shape, 1, part, 1, head, r), shape.headDim,
                            consumer.prompts[1].row(shape, 1, part, 1, head, r));
    const QString producerPath = m_dir.filePath("producer.h5"), consumerPath = m_dir.filePath("consumer.h5");
    writeSide(producerPath.toStdString(), producer);
    writeSide(consumerPath.toStdString(), consumer);

    QSignalSpy opened(&m_window->controller(), &AnalysisController::finished);
    m_window->openPath(consumerPath);
    QVERIFY(opened.wait(60000));
    QCOMPARE(page().mode(), ComparePage::Mode::Transfer);  // an engine-only capture is one end of a transfer
    QSignalSpy done(&page(), &ComparePage::comparisonFinished);
    page().compareTransferWith(producerPath);
    QVERIFY(done.wait(60000));
    const TransferResult* r = page().transferView().result();
    QVERIFY(r);
    QCOMPARE(r->changedBlocks, std::size_t(1));
    QCOMPARE(r->changed.front().explanation.name, std::string("other_request"));
    QCOMPARE(r->changed.front().block.block, std::int64_t(1));
    auto* table = page().findChild<QTableWidget*>("transferTable");
    QVERIFY(table && table->rowCount() == 1);
    QCOMPARE(table->item(0, 4)->text(), QString("other_request"));
    // The map shows the prompt of the first change: p1, layer 1, positions 16-31 changed, the rest identical.
    const HeatmapGrid& grid = page().transferView().heatmap().grid();
    QCOMPARE(grid.rows, 2);
    QCOMPARE(grid.columns, std::int64_t(40));
    for (std::int64_t t = 0; t < 40; ++t) {
        QCOMPARE(grid.at(0, t), kTransferIdentical);
        QCOMPARE(grid.at(1, t), t >= 16 && t < 32 ? kTransferExplained : kTransferIdentical);
    }
    // The exported view is the transfer's map.
    QCOMPARE(&page().exportedMap(), &page().transferView().heatmap());
}

QTEST_MAIN(TestCompare)
#include "tst_gui_compare.moc"
