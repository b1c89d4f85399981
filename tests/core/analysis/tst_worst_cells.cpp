// The worst-cells list, worked by hand: it ranks by the number the map colours, in noise floors.
// Two-way that is the relative L2 over the cache dtype's rounding (bf16: 2^-8), so a cell whose
// L-inf is large but whose L2 is small (one element off by rounding, the drift's way) ranks below
// one whose whole vector moved; three-way, the head's L-inf over the cell's expected-vs-baseline
// L-inf.

#include "analysis/heatmap_grid.h"
#include "analysis/worst_cells.h"
#include "quiet_prompt.h"

#include <QTest>

#include <cmath>

using namespace kvscope;
using namespace kvtest;

namespace {

// 4 positions (3 of prompt), 2 heads.
PromptAnalysis prompt(bool threeWay)
{
    return quietPrompt(4, 3, 2, threeWay);
}

void set(PromptAnalysis& p, KvPart part, MetricKind kind, int layer, std::int64_t token, int head, float value)
{
    setMetric(p, part, kind, layer, token, head, value);
}

}  // namespace

class TestWorstCells : public QObject {
    Q_OBJECT

private slots:
    void twoWayRanksByL2InFloors()
    {
        PromptAnalysis p = prompt(false);
        // Layer 0 token 1, head 1, K: L-inf 0.5 but L2 0.01 (2.56 floors of 2^-8).
        set(p, KvPart::K, MetricKind::Linf, 0, 1, 1, 0.5f);
        set(p, KvPart::K, MetricKind::L2, 0, 1, 1, 0.01f);
        // Layer 1 token 2, head 0, V: L-inf 0.1, L2 0.08 (20.48 floors).
        set(p, KvPart::V, MetricKind::Linf, 1, 2, 0, 0.1f);
        set(p, KvPart::V, MetricKind::L2, 1, 2, 0, 0.08f);
        const std::vector<WorstCell> cells = worstCells(p, 3);
        QCOMPARE(cells.size(), std::size_t(3));
        QCOMPARE(cells[0].layer, 1);
        QCOMPARE(cells[0].token, std::int64_t(2));
        QCOMPARE(cells[0].head, 0);
        QCOMPARE(cells[0].part, KvPart::V);
        QCOMPARE(cells[0].error, 0.08f);
        QCOMPARE(double(cells[0].baseError), 1.0 / 256);
        QVERIFY(std::abs(double(cells[0].ratio) - 20.48) < 1e-4);
        QCOMPARE(cells[1].layer, 0);
        QCOMPARE(cells[1].token, std::int64_t(1));
        QVERIFY(std::abs(double(cells[1].ratio) - 2.56) < 1e-4);
        QVERIFY(std::abs(double(cells[2].ratio) - 0.256) < 1e-4);  // a quiet cell: 1e-3 * 256
        QCOMPARE(QString(worstCellStatistic(p)), QString("relative L2"));
        // The map says the same of that cell.
        HeatmapSpec spec;
        spec.metric = HeatmapMetric::ErrorRatio;
        spec.part = KvPart::V;
        int head = -1;
        QCOMPARE(heatmapValue(p, spec, 1, 2, &head), cells[0].ratio);
        QCOMPARE(head, 0);
    }

    void threeWayRanksByLinfOverTheBase()
    {
        PromptAnalysis p = prompt(true);
        // Layer 0 token 3 head 0 K: L-inf 0.3 over a base of 0.01 (both heads' base: the cell's
        // floor is their largest) = 30 floors; layer 1 token 0 head 1 V: 0.5 over a base 0.1 = 5.
        set(p, KvPart::K, MetricKind::Linf, 0, 3, 0, 0.3f);
        set(p, KvPart::V, MetricKind::Linf, 1, 0, 1, 0.5f);
        p.metrics[std::size_t(baseOf(metricFor(KvPart::V, MetricKind::Linf)))][p.cell(1, 0, 0)] = 0.1f;
        const std::vector<WorstCell> cells = worstCells(p, 2);
        QCOMPARE(cells.size(), std::size_t(2));
        QCOMPARE(cells[0].layer, 0);
        QCOMPARE(cells[0].token, std::int64_t(3));
        QVERIFY(std::abs(double(cells[0].ratio) - 30.0) < 1e-4);
        QCOMPARE(cells[0].baseError, 1e-2f);
        QCOMPARE(cells[1].layer, 1);
        QCOMPARE(cells[1].head, 1);
        QVERIFY(std::abs(double(cells[1].ratio) - 5.0) < 1e-4);
        QCOMPARE(cells[1].baseError, 0.1f);
        QCOMPARE(QString(worstCellStatistic(p)), QString("relative L-inf"));
    }

    void nonFiniteCellsComeFirst()
    {
        // A cell 1000 floors off, and two cells whose input holds NaN or infinity (their metrics
        // absent, as the comparison leaves them): those two come first, in layer and token
        // order, whatever the floors; then the finite cells by ratio.
        for (bool threeWay : {true, false}) {
            PromptAnalysis p = prompt(threeWay);
            set(p, KvPart::K, threeWay ? MetricKind::Linf : MetricKind::L2, 0, 0, 0, 10.0f);
            for (MetricKind kind : {MetricKind::Cos, MetricKind::Linf, MetricKind::L2}) {
                set(p, KvPart::V, kind, 1, 2, 1, std::nanf(""));
                set(p, KvPart::K, kind, 0, 3, 0, std::nanf(""));
            }
            // Layer 1 token 2: V of head 1 NaN in the reference (expected) and in the engine;
            // layer 0 token 3: K of head 0 +inf in the engine.
            p.nonFinite = {{0, 3, 0, KvPart::K, "actual", "inf"},
                           {1, 2, 1, KvPart::V, "actual", "nan"},
                           {1, 2, 1, KvPart::V, "expected", "nan"}};
            const std::vector<WorstCell> cells = worstCells(p, 4);
            QCOMPARE(cells.size(), std::size_t(4));
            QVERIFY(cells[0].nonFinite && cells[1].nonFinite && !cells[2].nonFinite);
            QCOMPARE(cells[0].layer, 0);
            QCOMPARE(cells[0].token, std::int64_t(3));
            QCOMPARE(cells[0].part, KvPart::K);
            QVERIFY(std::isinf(cells[0].ratio) && cells[0].ratio > 0);
            QVERIFY(std::isinf(cells[0].error));
            QCOMPARE(QString::fromStdString(nonFiniteSideText(cells[0])), QString("inf (engine)"));
            QCOMPARE(cells[1].layer, 1);
            QCOMPARE(cells[1].token, std::int64_t(2));
            QCOMPARE(cells[1].head, 1);
            QCOMPARE(cells[1].part, KvPart::V);
            QVERIFY(std::isnan(cells[1].error));
            QCOMPARE(QString::fromStdString(cells[1].side), QString("actual"));  // one entry a (layer, token)
            QCOMPARE(QString::fromStdString(nonFiniteText(cells[1])), QString("NaN"));
            // Then the 1000-floor cell (three-way 10 / 1e-2, two-way 10 * 256).
            QCOMPARE(cells[2].layer, 0);
            QCOMPARE(cells[2].token, std::int64_t(0));
            QVERIFY(std::abs(double(cells[2].ratio) - (threeWay ? 1000.0 : 2560.0)) < 1e-2);
            // Only as many as asked; an unfinished layer's are not listed.
            QCOMPARE(worstCells(p, 1).size(), std::size_t(1));
            const std::vector<char> onlyLayer1 = {0, 1};
            const std::vector<WorstCell> ready = worstCells(p, 2, &onlyLayer1);
            QCOMPARE(ready[0].layer, 1);
            QVERIFY(ready[0].nonFinite && !ready[1].nonFinite);
            // A NaN only in the reference says so.
            p.nonFinite = {{1, 2, 1, KvPart::V, "expected", "nan"}};
            QCOMPARE(QString::fromStdString(nonFiniteSideText(worstCells(p, 1)[0])), QString("NaN (expected)"));
        }
    }
};

QTEST_GUILESS_MAIN(TestWorstCells)
#include "tst_worst_cells.moc"
