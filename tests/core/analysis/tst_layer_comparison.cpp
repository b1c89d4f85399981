// One layer of one prompt against double-precision references: every metric, per-token BC,
// absent positions, non-finite input, shape mismatches, and the reductions over heads.

#include "analysis/layer_comparison.h"
#include "metric_reference.h"
#include "test_support.h"

#include <QTest>

#include <cstring>

#include <random>

using namespace kvscope;
using namespace kvtest;

class TestLayerComparison : public QObject {
    Q_OBJECT

private slots:
    void compareLayer_data();
    void compareLayer();
    void nonFiniteInputIsReportedNotAveraged();
    void shapeMismatchIsAnError();
    void reductions();
    void tokensSplitOverThreadsGiveTheSameResult();
};

void TestLayerComparison::compareLayer_data()
{
    QTest::addColumn<int>("heads");
    QTest::addColumn<int>("seq");
    QTest::addColumn<int>("dim");
    QTest::addColumn<bool>("threeWay");
    QTest::newRow("8 heads, 3-way") << 8 << 24 << 16 << true;
    QTest::newRow("1 head, 3-way") << 1 << 10 << 64 << true;
    QTest::newRow("single token") << 4 << 1 << 8 << true;
    QTest::newRow("2-way") << 2 << 12 << 32 << false;
}

void TestLayerComparison::compareLayer()
{
    QFETCH(int, heads);
    QFETCH(int, seq);
    QFETCH(int, dim);
    QFETCH(bool, threeWay);
    std::mt19937 rng(11);
    const LayerKv baseline = randomLayer(heads, seq, dim, rng, 0);
    LayerKv expected = randomLayer(heads, seq, dim, rng, 0.004f, &baseline);
    LayerKv actual = randomLayer(heads, seq, dim, rng, 0.01f, &baseline);
    // Absent positions on each side (never written, outside a window, padding).
    if (seq > 5) {
        actual.clear(seq - 1);
        expected.clear(0);
        if (threeWay)
            const_cast<LayerKv&>(baseline).clear(2);
    }
    // A zero vector in the reference.
    std::fill_n(const_cast<LayerKv&>(baseline).k.begin() + std::ptrdiff_t(baseline.index(KvPart::K, 0, seq / 2)), dim, 0.0f);
    const LayerKv& reference = threeWay ? baseline : expected;
    PromptAnalysis p = emptyPrompt(2, seq, heads, threeWay);
    std::vector<NonFiniteCell> nonFinite;
    TokenErrorStats stats;
    kvscope::compareLayer(reference, actual, threeWay ? &expected : nullptr, 1, p, nonFinite, &stats);
    QVERIFY(nonFinite.empty());

    for (std::int64_t t = 0; t < seq; ++t) {
        const bool held = reference.present[std::size_t(t)] && actual.present[std::size_t(t)] &&
                          (!threeWay || expected.present[std::size_t(t)]);
        for (int h = 0; h < heads; ++h) {
            QVERIFY(std::isnan(p.value(Metric::KLinf, 0, t, h)));  // layer 0 untouched
            for (KvPart part : {KvPart::K, KvPart::V}) {
                const auto at = [&](const LayerKv& kv) { return part == KvPart::K ? kv.kAt(h, t) : kv.vAt(h, t); };
                if (!held) {
                    for (int m = 0; m < kMetricCount; ++m)
                        QVERIFY(std::isnan(p.value(Metric(m), 1, t, h)));
                    continue;
                }
                const Ref target = referenceMetrics(at(reference), at(actual), dim);
                QVERIFY(close(p.value(metricFor(part, MetricKind::Cos), 1, t, h), target.cos));
                QVERIFY(close(p.value(metricFor(part, MetricKind::Linf), 1, t, h), target.linf));
                QVERIFY(close(p.value(metricFor(part, MetricKind::L2), 1, t, h), target.l2));
                if (threeWay) {
                    const Ref base = referenceMetrics(at(reference), at(expected), dim);
                    QVERIFY(close(p.value(baseOf(metricFor(part, MetricKind::Linf)), 1, t, h), base.linf));
                    QVERIFY(close(p.value(baseOf(metricFor(part, MetricKind::L2)), 1, t, h), base.l2));
                    QVERIFY(close(p.value(baseOf(metricFor(part, MetricKind::Cos)), 1, t, h), base.cos));
                } else {
                    QVERIFY(std::isnan(p.value(baseOf(metricFor(part, MetricKind::Linf)), 1, t, h)));
                }
            }
        }
        for (KvPart part : {KvPart::K, KvPart::V}) {
            const float bc = p.bcValue(part, 1, t);
            if (!threeWay || !held) {
                QVERIFY(std::isnan(bc));
                continue;
            }
            const std::vector<double> eb = errors(reference, expected, t, part), et = errors(reference, actual, t, part);
            const double expect = referenceBc(eb, et);
            QVERIFY2(std::abs(bc - expect) < 1e-6, qPrintable(QString("token %1: %2 vs %3").arg(t).arg(bc).arg(expect)));
            // What aggregation keeps: the range of both sets, and each set's counts.
            double lo = eb[0], hi = eb[0];
            for (const auto* set : {&eb, &et})
                for (double e : *set)
                    lo = std::min(lo, e), hi = std::max(hi, e);
            QCOMPARE(stats.range(part, t).lo, lo);
            QCOMPARE(stats.range(part, t).hi, hi);
            for (int set = 0; set < 2; ++set) {
                std::uint64_t total = 0;
                for (int b = 0; b < kBcBins; ++b)
                    total += stats.countsOf(part, t, set)[b];
                QCOMPARE(total, std::uint64_t(eb.size()));
            }
        }
    }
}

void TestLayerComparison::nonFiniteInputIsReportedNotAveraged()
{
    std::mt19937 rng(2);
    const LayerKv baseline = randomLayer(2, 4, 8, rng, 0);
    const LayerKv expected = randomLayer(2, 4, 8, rng, 0.01f, &baseline);
    LayerKv actual = randomLayer(2, 4, 8, rng, 0.01f, &baseline);
    actual.k[actual.index(KvPart::K, 1, 2) + 3] = std::nanf("");
    PromptAnalysis p = emptyPrompt(1, 4, 2, true);
    std::vector<NonFiniteCell> nonFinite;
    kvscope::compareLayer(baseline, actual, &expected, 0, p, nonFinite);
    QCOMPARE(nonFinite.size(), std::size_t(1));
    QCOMPARE(nonFinite[0].token, std::int64_t(2));
    QCOMPARE(nonFinite[0].head, 1);
    QCOMPARE(nonFinite[0].side, std::string("actual"));
    QVERIFY(std::isnan(p.value(Metric::KLinf, 0, 2, 1)));
    QVERIFY(!std::isnan(p.value(Metric::KLinf, 0, 2, 0)));
    QVERIFY(!std::isnan(p.value(Metric::VLinf, 0, 2, 1)));
    // The max over heads skips the cell: it is not taken for a number.
    QCOMPARE(maxOverHeads(p, Metric::KLinf, 0, 2).head, 0);
}

void TestLayerComparison::shapeMismatchIsAnError()
{
    std::mt19937 rng(2);
    const LayerKv a = randomLayer(2, 4, 8, rng, 0);
    const LayerKv b = randomLayer(2, 5, 8, rng, 0);
    PromptAnalysis p = emptyPrompt(1, 4, 2, false);
    std::vector<NonFiniteCell> nf;
    QVERIFY_THROWS_EXCEPTION(std::invalid_argument, kvscope::compareLayer(a, b, nullptr, 0, p, nf));
    const LayerKv c = randomLayer(3, 4, 8, rng, 0);
    QVERIFY_THROWS_EXCEPTION(std::invalid_argument, kvscope::compareLayer(a, a, &c, 0, p, nf));
}

void TestLayerComparison::reductions()
{
    PromptAnalysis p = emptyPrompt(1, 2, 3, true);
    auto set = [&](Metric m, std::int64_t t, int h, float v) { p.metrics[std::size_t(m)][p.cell(0, t, h)] = v; };
    set(Metric::KLinf, 0, 0, 0.1f), set(Metric::KLinf, 0, 2, 0.4f);  // head 1 absent
    set(Metric::BaseKLinf, 0, 0, 0.05f), set(Metric::BaseKLinf, 0, 2, 0.02f);
    QCOMPARE(maxOverHeads(p, Metric::KLinf, 0, 0).head, 2);
    QCOMPARE(maxOverHeads(p, Metric::KLinf, 0, 0).value, 0.4f);
    QCOMPARE(minOverHeads(p, Metric::KLinf, 0, 0).head, 0);
    QVERIFY(std::abs(meanOverHeads(p, Metric::KLinf, 0, 0) - 0.25f) < 1e-7);
    // The noise floor is the largest base error, 0.05; per head: 0.1/0.05 = 2 and 0.4/0.05 = 8;
    // the cell: 8 at head 2 (= max/max); the mean over heads: 0.25/0.05 = 5.
    QCOMPARE(noiseFloor(p, Metric::KLinf, 0, 0), 0.05f);
    QVERIFY(std::abs(errorRatio(p, Metric::KLinf, 0, 0).value - 8.0f) < 1e-5);
    QCOMPARE(errorRatio(p, Metric::KLinf, 0, 0).head, 2);
    QVERIFY(std::abs(headErrorRatio(p, Metric::KLinf, 0, 0, 0) - 2.0f) < 1e-6);
    QVERIFY(std::abs(headErrorRatio(p, Metric::KLinf, 0, 0, 2) - 8.0f) < 1e-5);
    QVERIFY(std::isnan(headErrorRatio(p, Metric::KLinf, 0, 0, 1)));  // head 1 absent
    QVERIFY(std::abs(meanErrorRatio(p, Metric::KLinf, 0, 0) - 5.0f) < 1e-5);
    QVERIFY(std::isnan(errorRatio(p, Metric::KLinf, 0, 1).value));  // token 1: no data
    QCOMPARE(errorRatio(p, Metric::KLinf, 0, 1).head, -1);
    QCOMPARE(maxOverHeads(p, Metric::KLinf, 0, 1).head, -1);
    set(Metric::KLinf, 1, 1, 0.3f), set(Metric::BaseKLinf, 1, 1, 0.0f);
    QVERIFY(std::abs(errorRatio(p, Metric::KLinf, 0, 1).value - 0.3f / 1e-10f) < 1e4);  // base clamped at 1e-10
    const Extreme e = layerMax(p, Metric::KLinf, 0);
    QCOMPARE(e.token, std::int64_t(0));
    QCOMPARE(e.head, 2);
}

void TestLayerComparison::tokensSplitOverThreadsGiveTheSameResult()
{
    std::mt19937 rng(11);
    const int heads = 3, dim = 16;
    const std::int64_t seq = 400;
    const LayerKv baseline = randomLayer(heads, seq, dim, rng, 0);
    const LayerKv expected = randomLayer(heads, seq, dim, rng, 0.004f, &baseline);
    LayerKv actual = randomLayer(heads, seq, dim, rng, 0.01f, &baseline);
    actual.k[actual.index(KvPart::K, 1, 350)] = std::nanf("");  // non-finite cells in two ranges
    actual.v[actual.index(KvPart::V, 2, 10)] = INFINITY;
    actual.clear(200);
    PromptAnalysis one = emptyPrompt(1, seq, heads, true), split = one;
    std::vector<NonFiniteCell> nf1, nf3;
    TokenErrorStats s1, s3;
    kvscope::compareLayer(baseline, actual, &expected, 0, one, nf1, &s1);
    WorkTeam team(3);
    kvscope::compareLayer(baseline, actual, &expected, 0, split, nf3, &s3, &team);
    for (int m = 0; m < kMetricCount; ++m)
        QVERIFY(std::memcmp(one.metrics[std::size_t(m)].data(), split.metrics[std::size_t(m)].data(),
                            one.metrics[std::size_t(m)].size() * sizeof(float)) == 0);
    for (int part = 0; part < 2; ++part) {
        QVERIFY(std::memcmp(one.bc[std::size_t(part)].data(), split.bc[std::size_t(part)].data(),
                            one.bc[std::size_t(part)].size() * sizeof(float)) == 0);
        QVERIFY(s1.counts[std::size_t(part)] == s3.counts[std::size_t(part)]);
    }
    QCOMPARE(nf3.size(), nf1.size());
    QCOMPARE(nf1.size(), std::size_t(2));
    for (std::size_t i = 0; i < nf1.size(); ++i)
        QCOMPARE(nf3[i].token, nf1[i].token);
    QVERIFY(nf3[0].token < nf3[1].token);  // in token order
}

QTEST_APPLESS_MAIN(TestLayerComparison)
#include "tst_layer_comparison.moc"
