// The metric engine against plain double-precision implementations written here: vector
// metrics, Bhattacharyya coefficients (hand-worked and numpy-binned), whole-layer
// comparison with absent positions, aggregation across prompts, drill-down histograms,
// divergences from logits, reductions, cancellation and the JSON output.

#include "analysis/analysis_json.h"
#include "analysis/analyzer.h"
#include "format/bundle_writer.h"
#include "synth/synthetic_capture.h"
#include "analysis/divergence.h"
#include "metrics/error_histogram.h"
#include "analysis/layer_comparison.h"
#include "test_support.h"
#include "metrics/vector_metrics.h"

#include <nlohmann/json.hpp>

#include <QTemporaryDir>
#include <QTest>

#include <fstream>
#include <random>
#include <sstream>

using namespace kvscope;

namespace {

// ---- independent reference implementations ----

struct Ref {
    double cos, linf, l2;
};

Ref referenceMetrics(const float* a, const float* b, int n)
{
    double dot = 0, na = 0, nb = 0, nd = 0, md = 0, ma = 0;
    for (int i = 0; i < n; ++i) {
        dot += double(a[i]) * b[i];
        na += double(a[i]) * a[i];
        nb += double(b[i]) * b[i];
        const double d = double(a[i]) - b[i];
        nd += d * d;
        md = std::max(md, std::abs(d));
        ma = std::max(ma, std::abs(double(a[i])));
    }
    return {dot / (std::max(std::sqrt(na), 1e-8) * std::max(std::sqrt(nb), 1e-8)), md / std::max(ma, 1e-10),
            std::sqrt(nd) / std::max(std::sqrt(na), 1e-10)};
}

// numpy.histogram semantics, by definition: bin i holds v with edge(i) <= v < edge(i+1),
// the last bin also v == hi; edge(i) = i * (hi - lo) / 100 + lo.
double referenceBc(const std::vector<double>& a, const std::vector<double>& b)
{
    if (a.empty() || b.empty())
        return 0;
    double lo = a[0], hi = a[0];
    for (const auto* set : {&a, &b})
        for (double v : *set)
            lo = std::min(lo, v), hi = std::max(hi, v);
    if (lo == hi)
        lo -= 0.5, hi += 0.5;
    const double step = (hi - lo) / 100;
    auto bin = [&](double v) {
        int i = 99;
        while (i > 0 && double(i) * step + lo > v)
            --i;
        return i;
    };
    std::vector<double> p(100), q(100);
    for (double v : a)
        p[std::size_t(bin(v))] += 1;
    for (double v : b)
        q[std::size_t(bin(v))] += 1;
    double bc = 0;
    for (int i = 0; i < 100; ++i)
        bc += std::sqrt(p[std::size_t(i)] / (double(a.size()) + 1e-10) * q[std::size_t(i)] / (double(b.size()) + 1e-10));
    return std::clamp(bc, 0.0, 1.0);
}

LayerKv randomLayer(int heads, std::int64_t seq, int dim, std::mt19937& rng, float noise, const LayerKv* around = nullptr)
{
    std::normal_distribution<float> n01;
    LayerKv kv = LayerKv::absent(heads, seq, dim);
    std::fill(kv.present.begin(), kv.present.end(), 1);
    for (std::size_t i = 0; i < kv.k.size(); ++i) {
        kv.k[i] = around ? around->k[i] + noise * n01(rng) : n01(rng);
        kv.v[i] = around ? around->v[i] + noise * n01(rng) : n01(rng);
    }
    return kv;
}

std::vector<double> errors(const LayerKv& ref, const LayerKv& x, std::int64_t t, KvPart part, int onlyHead = -1)
{
    std::vector<double> e;
    for (int h = 0; h < ref.heads; ++h) {
        if (onlyHead >= 0 && h != onlyHead)
            continue;
        const float* a = part == KvPart::K ? ref.kAt(h, t) : ref.vAt(h, t);
        const float* b = part == KvPart::K ? x.kAt(h, t) : x.vAt(h, t);
        for (int d = 0; d < ref.headDim; ++d)
            e.push_back(std::fabs(a[d] - b[d]));
    }
    return e;
}

PromptAnalysis emptyPrompt(int layers, std::int64_t tokens, int heads, bool threeWay)
{
    PromptAnalysis p;
    p.tokens = tokens;
    p.heads = heads;
    p.threeWay = threeWay;
    for (int l = 0; l < layers; ++l)
        p.layers.push_back("l" + std::to_string(l));
    p.allocate();
    return p;
}

bool close(double a, double b, double rel = 2e-6)
{
    return std::abs(a - b) <= rel * std::max(1.0, std::abs(b));
}

}  // namespace

class TestMetrics : public QObject {
    Q_OBJECT

private slots:
    void initTestCase();
    void vectorMetrics();
    void bcHandWorked();
    void bcBinsFollowNumpy();
    void compareLayer_data();
    void compareLayer();
    void nonFiniteInputIsReportedNotAveraged();
    void shapeMismatchIsAnError();
    void reductions();
    void aggregationEqualsPooledErrors();
    void singlePromptAggregate();
    void headHistogram();
    void divergencesFromLogits();
    void progressAndCancellation();
    void jsonIsStrictAndComplete();
    void layerSelection();

private:
    QTemporaryDir m_dir;
    std::string m_demo;
};

void TestMetrics::initTestCase()
{
    m_demo = m_dir.filePath("demo.h5").toStdString();
    SyntheticCaptureOptions o = demoCaptureOptions();
    o.layers = 4;
    o.promptLens = {20, 31, 26};
    o.decodeTokens = 12;
    o.faultLayer = 3;
    o.divergence = 4;
    writeSyntheticCapture(m_demo, o);
}

void TestMetrics::vectorMetrics()
{
    std::mt19937 rng(3);
    std::normal_distribution<float> n01;
    for (int dim : {1, 3, 128}) {
        for (int trial = 0; trial < 50; ++trial) {
            std::vector<float> a(static_cast<std::size_t>(dim)), b(static_cast<std::size_t>(dim));
            for (int i = 0; i < dim; ++i)
                a[std::size_t(i)] = n01(rng) * 5, b[std::size_t(i)] = a[std::size_t(i)] + n01(rng) * 0.1f;
            if (trial == 1)
                std::fill(a.begin(), a.end(), 0.0f);  // zero reference
            if (trial == 2)
                std::fill(b.begin(), b.end(), 0.0f);  // zero target
            if (trial == 3)
                b = a;  // identical
            VectorComparison c;
            QVERIFY(compareVectors(a.data(), b.data(), dim, c));
            const Ref r = referenceMetrics(a.data(), b.data(), dim);
            QVERIFY2(close(c.cos, r.cos, 1e-12) && close(c.linf, r.linf, 1e-12) && close(c.l2, r.l2, 1e-12),
                     qPrintable(QString("dim %1 trial %2").arg(dim).arg(trial)));
        }
    }
    // Hand-worked: ref (3, 4), x (3, 0): cos = 9 / (5 * 3) = 0.6, L-inf = 4 / 4, L2 = 4 / 5.
    const float ref[2] = {3, 4}, x[2] = {3, 0};
    VectorComparison c;
    QVERIFY(compareVectors(ref, x, 2, c));
    QCOMPARE(c.cos, 0.6);
    QCOMPARE(c.linf, 1.0);
    QCOMPARE(c.l2, 0.8);
    const float nan[2] = {1, std::nanf("")};
    QVERIFY(!compareVectors(ref, nan, 2, c));
}

void TestMetrics::bcHandWorked()
{
    // The 1e-10 in p = counts / (sum + 1e-10) keeps identical sets a hair below 1.
    QVERIFY(std::abs(bhattacharyyaOfSets({0.1, 0.2, 0.3}, {0.1, 0.2, 0.3}) - 1.0) < 1e-9);  // identical
    QCOMPARE(bhattacharyyaOfSets({0, 0, 0}, {1, 1, 1}), 0.0);                               // disjoint ends
    QCOMPARE(bhattacharyyaOfSets({}, {1.0}), 0.0);                                          // empty set
    QVERIFY(std::abs(bhattacharyyaOfSets({2, 2}, {2, 2, 2}) - 1.0) < 1e-9);                 // zero-width range
    // a = {0, 0.5, 1}, b = {0, 1, 1} on [0, 1]: bins 0, 50, 99 and 0, 99, 99.
    // BC = sqrt(1/3 * 1/3) + sqrt(1/3 * 0) + sqrt(1/3 * 2/3) = 1/3 + sqrt(2)/3.
    QVERIFY(std::abs(bhattacharyyaOfSets({0, 0.5, 1}, {0, 1, 1}) - (1.0 + std::sqrt(2.0)) / 3.0) < 1e-9);
    // Four values in one bin vs spread over two: p = (1), q = (1/2, 1/2) -> sqrt(1/2).
    QVERIFY(std::abs(bhattacharyyaOfSets({0.0, 0.001, 0.002, 0.003}, {0.0, 0.0, 1.0, 1.0}) - std::sqrt(0.5)) < 1e-9);
}

void TestMetrics::bcBinsFollowNumpy()
{
    std::mt19937 rng(5);
    std::uniform_real_distribution<double> u(0, 1);
    for (int trial = 0; trial < 200; ++trial) {
        ErrorRange r;
        r.add(u(rng) * 0.01);
        r.add(0.01 + u(rng) * 3);
        const SharedBins bins(r);
        std::vector<double> values{r.lo, r.hi};
        for (int i = 0; i <= 100; ++i) {
            values.push_back(bins.edge(i));  // exactly on every edge, and one ulp either side
            values.push_back(std::nextafter(bins.edge(i), -1.0));
            values.push_back(std::nextafter(bins.edge(i), 10.0));
        }
        for (int i = 0; i < 20; ++i)
            values.push_back(r.lo + u(rng) * (r.hi - r.lo));
        for (double v : values) {
            if (v < r.lo || v > r.hi)
                continue;
            int expect = 99;
            while (expect > 0 && double(expect) * ((r.hi - r.lo) / 100) + r.lo > v)
                --expect;
            QCOMPARE(bins.binOf(v), expect);
        }
        QCOMPARE(bins.binOf(r.hi + 1e-9), -1);
        QCOMPARE(bins.binOf(std::nan("")), -1);
    }
}

void TestMetrics::compareLayer_data()
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

void TestMetrics::compareLayer()
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
    std::fill_n(const_cast<LayerKv&>(baseline).k.begin() + std::ptrdiff_t(baseline.index(0, seq / 2)), dim, 0.0f);
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
                QVERIFY(close(p.value(metricFor(part, 0), 1, t, h), target.cos));
                QVERIFY(close(p.value(metricFor(part, 1), 1, t, h), target.linf));
                QVERIFY(close(p.value(metricFor(part, 2), 1, t, h), target.l2));
                if (threeWay) {
                    const Ref base = referenceMetrics(at(reference), at(expected), dim);
                    QVERIFY(close(p.value(baseOf(metricFor(part, 1)), 1, t, h), base.linf));
                    QVERIFY(close(p.value(baseOf(metricFor(part, 2)), 1, t, h), base.l2));
                    QVERIFY(close(p.value(baseOf(metricFor(part, 0)), 1, t, h), base.cos));
                } else {
                    QVERIFY(std::isnan(p.value(baseOf(metricFor(part, 1)), 1, t, h)));
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

void TestMetrics::nonFiniteInputIsReportedNotAveraged()
{
    std::mt19937 rng(2);
    const LayerKv baseline = randomLayer(2, 4, 8, rng, 0);
    const LayerKv expected = randomLayer(2, 4, 8, rng, 0.01f, &baseline);
    LayerKv actual = randomLayer(2, 4, 8, rng, 0.01f, &baseline);
    actual.k[actual.index(1, 2) + 3] = std::nanf("");
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

void TestMetrics::shapeMismatchIsAnError()
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

void TestMetrics::reductions()
{
    PromptAnalysis p = emptyPrompt(1, 2, 3, true);
    auto set = [&](Metric m, std::int64_t t, int h, float v) { p.metrics[std::size_t(m)][p.cell(0, t, h)] = v; };
    set(Metric::KLinf, 0, 0, 0.1f), set(Metric::KLinf, 0, 2, 0.4f);  // head 1 absent
    set(Metric::BaseKLinf, 0, 0, 0.05f), set(Metric::BaseKLinf, 0, 2, 0.02f);
    QCOMPARE(maxOverHeads(p, Metric::KLinf, 0, 0).head, 2);
    QCOMPARE(maxOverHeads(p, Metric::KLinf, 0, 0).value, 0.4f);
    QCOMPARE(minOverHeads(p, Metric::KLinf, 0, 0).head, 0);
    QVERIFY(std::abs(meanOverHeads(p, Metric::KLinf, 0, 0) - 0.25f) < 1e-7);
    QVERIFY(std::abs(errorRatio(p, Metric::KLinf, 0, 0) - 0.4f / 0.05f) < 1e-5);  // max / max, not per head
    QVERIFY(std::isnan(errorRatio(p, Metric::KLinf, 0, 1)));                       // token 1: no data
    QCOMPARE(maxOverHeads(p, Metric::KLinf, 0, 1).head, -1);
    set(Metric::KLinf, 1, 1, 0.3f), set(Metric::BaseKLinf, 1, 1, 0.0f);
    QVERIFY(std::abs(errorRatio(p, Metric::KLinf, 0, 1) - 0.3f / 1e-10f) < 1e4);  // base clamped at 1e-10
    const Extreme e = layerMax(p, Metric::KLinf, 0);
    QCOMPARE(e.token, std::int64_t(0));
    QCOMPARE(e.head, 2);
}

void TestMetrics::aggregationEqualsPooledErrors()
{
    auto reader = std::make_shared<BundleReader>(m_demo);
    const AnalysisResult result = analyzeBundle(reader);
    QVERIFY(result.aggregate);
    const AggregateBc& agg = *result.aggregate;
    QCOMPARE(agg.promptIds.size(), std::size_t(3));
    QCOMPARE(agg.generationCount, std::int64_t(12));  // every prompt has 12 decode positions
    QCOMPARE(agg.divergenceCounts[4], 3);              // all three diverged at generation index 4
    QCOMPARE(agg.divergenceCounts[3], 0);

    const CaptureLoader loader(reader);
    for (std::size_t l = 0; l < agg.layers.size(); ++l) {
        std::vector<LayerKv> base, expected, actual;
        for (const PromptAnalysis& p : result.prompts) {
            base.push_back(loader.referenceLayer(p.id, ReferenceRole::Baseline, agg.layers[l]));
            expected.push_back(loader.referenceLayer(p.id, ReferenceRole::Expected, agg.layers[l]));
            actual.push_back(loader.engineLayer(p.id, agg.layers[l]));
        }
        auto held = [&](std::size_t i, std::int64_t t) {
            return base[i].present[std::size_t(t)] && expected[i].present[std::size_t(t)] && actual[i].present[std::size_t(t)];
        };
        for (KvPart part : {KvPart::K, KvPart::V}) {
            std::vector<double> allBase, allTarget;
            for (std::int64_t g = 0; g < agg.generationCount; ++g) {
                std::vector<double> pb, pt;
                for (std::size_t i = 0; i < result.prompts.size(); ++i) {
                    const std::int64_t t = result.prompts[i].promptLen + g;
                    if (!held(i, t))
                        continue;
                    const auto eb = errors(base[i], expected[i], t, part), et = errors(base[i], actual[i], t, part);
                    pb.insert(pb.end(), eb.begin(), eb.end());
                    pt.insert(pt.end(), et.begin(), et.end());
                }
                const float got = agg.bc[std::size_t(part)][l * std::size_t(agg.generationCount) + std::size_t(g)];
                if (pb.empty()) {
                    QVERIFY(std::isnan(got));  // no prompt holds it: no data, never BC 1
                    continue;
                }
                QVERIFY2(std::abs(got - referenceBc(pb, pt)) < 1e-6,
                         qPrintable(QString("layer %1 g %2: %3 vs %4").arg(l).arg(g).arg(got).arg(referenceBc(pb, pt))));
            }
            for (std::size_t i = 0; i < result.prompts.size(); ++i)
                for (std::int64_t t = 0; t < base[i].seq; ++t)
                    if (held(i, t)) {
                        const auto eb = errors(base[i], expected[i], t, part), et = errors(base[i], actual[i], t, part);
                        allBase.insert(allBase.end(), eb.begin(), eb.end());
                        allTarget.insert(allTarget.end(), et.begin(), et.end());
                    }
            QVERIFY(std::abs(agg.combined[std::size_t(part)][l] - referenceBc(allBase, allTarget)) < 1e-6);
        }
    }
    // The last generation index is the never-written last position: no data anywhere.
    QVERIFY(std::isnan(agg.bc[0][std::size_t(agg.generationCount) - 1]));
}

void TestMetrics::singlePromptAggregate()
{
    // One prompt pooled: each generation index holds one token, so its aggregated BC is that
    // token's BC (checked against the plain implementation in compareLayer above).
    AnalysisOptions options;
    options.prompts = {"prompt_1"};
    const AnalysisResult r = analyzeBundle(std::make_shared<BundleReader>(m_demo), options);
    const PromptAnalysis& p = r.prompts.at(0);
    const AggregateBc& a = *r.aggregate;
    QCOMPARE(a.generationCount, p.tokens - p.promptLen);
    int compared = 0;
    for (int l = 0; l < int(p.layers.size()); ++l)
        for (std::int64_t g = 0; g < a.generationCount; ++g)
            for (KvPart part : {KvPart::K, KvPart::V}) {
                const float token = p.bcValue(part, l, p.promptLen + g);
                const float pooled = a.bc[std::size_t(part)][std::size_t(l) * std::size_t(a.generationCount) + std::size_t(g)];
                QVERIFY(std::isnan(token) == std::isnan(pooled));
                if (!std::isnan(token)) {
                    QCOMPARE(pooled, token);
                    ++compared;
                }
            }
    QVERIFY(compared > 50);
}

void TestMetrics::headHistogram()
{
    const CaptureLoader loader(std::make_shared<BundleReader>(m_demo));
    const std::string layer = "model.layers.3.self_attn";
    const HeadErrorHistogram h = headErrorHistogram(loader, "prompt_1", layer, 1, KvPart::K, 20, 40);
    const LayerKv base = loader.referenceLayer("prompt_1", ReferenceRole::Baseline, layer);
    const LayerKv expected = loader.referenceLayer("prompt_1", ReferenceRole::Expected, layer);
    const LayerKv actual = loader.engineLayer("prompt_1", layer);
    std::vector<double> eb, et;
    std::int64_t used = 0;
    for (std::int64_t t = 20; t < 40; ++t) {
        if (!actual.present[std::size_t(t)])
            continue;
        ++used;
        const auto b = errors(base, expected, t, KvPart::K, 1), a = errors(base, actual, t, KvPart::K, 1);
        eb.insert(eb.end(), b.begin(), b.end());
        et.insert(et.end(), a.begin(), a.end());
    }
    QCOMPARE(h.tokensUsed, used);
    QCOMPARE(h.base->total(), std::uint64_t(eb.size()));
    QCOMPARE(h.target.total(), std::uint64_t(et.size()));
    QVERIFY(std::abs(h.bc - referenceBc(eb, et)) < 1e-6);
    QCOMPARE(h.hi, std::max(*std::max_element(eb.begin(), eb.end()), *std::max_element(et.begin(), et.end())));
    QVERIFY_THROWS_EXCEPTION(std::invalid_argument, headErrorHistogram(loader, "prompt_1", layer, 9, KvPart::K, 0, 5));
    QVERIFY_THROWS_EXCEPTION(std::invalid_argument, headErrorHistogram(loader, "prompt_1", layer, 0, KvPart::K, 5, 500));
}

void TestMetrics::divergencesFromLogits()
{
    // ULP bound, hand-worked: |v| = 10 -> 2^(3 - 7) = 0.0625; |v| = 0.75 -> 2^(-1 - 7).
    QCOMPARE(ulpBound(10.0), 0.0625);
    QCOMPARE(ulpBound(-0.75), std::ldexp(1.0, -8));

    const QString path = m_dir.filePath("logits.h5");
    const KvCacheConfig cfg = KvCacheConfig::fromJson(kvtest::configJson(8, 1, 1, 2, {{{"l0"}, "FullAttentionSpec", 4}}));
    {
        BundleWriter w(path.toStdString(), {}, cfg);
        w.addPrompt({"p", {1, 2, 3}, {4, 1, 2, 0, 3}, std::nullopt, {}});
        EngineSnapshot s;
        s.seqLens = {8};
        s.blockTables = {kvtest::table({{1, 2}}, 2)};
        s.ranks = {{{"l0", {RawTensor::fromFloat(DType::Float32, {8, 1, 4, 2}, std::vector<float>(64, 1.0f)),
                            RawTensor::fromFloat(DType::Float32, {8, 1, 4, 2}, std::vector<float>(64, 1.0f))}}}};
        w.addSnapshot("p", s);
        const RawTensor ref = RawTensor::fromFloat(DType::Float32, {1, 1, 8, 2}, std::vector<float>(16, 1.0f));
        w.addReference("p", ReferenceRole::Expected, "l0", ref, ref);
        // vocab 5; teacher tokens 4, 1, 2, 0, 3. Step 1: engine prefers 3 by 0.05 at |v| = 10
        // (within 0.0625); step 3: prefers 4 by 1.0 (beyond).
        Logits actual{5, 5, std::vector<float>(25, 0.0f)};
        auto row = [&](int g) { return actual.values.data() + g * 5; };
        row(0)[4] = 10;
        row(1)[1] = 9.95f, row(1)[3] = 10;
        row(2)[2] = 10;
        row(3)[0] = 9, row(3)[4] = 10;
        row(4)[3] = 10;
        w.addLogits("p", LogitsRole::Actual, actual);
        w.finish();
    }
    const BundleReader reader(path.toStdString());
    const std::vector<Divergence> d = findDivergences(reader, reader.prompt("p"));
    QCOMPARE(d.size(), std::size_t(2));
    QCOMPARE(d[0].position, std::int64_t(3 + 1));
    QVERIFY(d[0].derived);
    QCOMPARE(*d[0].engineToken, std::int64_t(3));
    QCOMPARE(*d[0].teacherToken, std::int64_t(1));
    QVERIFY(std::abs(*d[0].logitGap - (10.0 - double(9.95f))) < 1e-12);
    QCOMPARE(*d[0].ulpBound, 0.0625);
    QVERIFY(*d[0].inBounds);
    QCOMPARE(d[1].position, std::int64_t(3 + 3));
    QVERIFY(!*d[1].inBounds);
}

void TestMetrics::progressAndCancellation()
{
    auto reader = std::make_shared<BundleReader>(m_demo);
    AnalysisOptions options;
    std::vector<int> done;
    std::mutex m;
    options.layerDone = [&](int, int n, int total) {
        std::lock_guard lock(m);
        done.push_back(n);
        QCOMPARE(total, 4);
    };
    analyzeBundle(reader, options);
    std::sort(done.begin(), done.end());
    QCOMPARE(done, (std::vector<int>{1, 2, 3, 4}));

    std::atomic<bool> cancel{false};
    options.threads = 1;
    options.cancel = &cancel;
    int calls = 0;
    options.layerDone = [&](int, int, int) {
        ++calls;
        cancel = true;
    };
    QVERIFY_THROWS_EXCEPTION(AnalysisCancelled, analyzeBundle(reader, options));
    QCOMPARE(calls, 1);
}

void TestMetrics::jsonIsStrictAndComplete()
{
    auto reader = std::make_shared<BundleReader>(m_demo);
    const AnalysisResult result = analyzeBundle(reader);
    std::ostringstream text;
    writeAnalysisJson(result, text);
    QVERIFY(text.str().find("NaN") == std::string::npos);
    QVERIFY(text.str().find("nan") == std::string::npos);
    const nlohmann::json j = nlohmann::json::parse(text.str());  // strict: throws on NaN, Infinity
    QCOMPARE(j["format"].get<std::string>(), std::string("kvscope-analysis"));
    QCOMPARE(j["prompts"].size(), std::size_t(3));
    const auto& p = j["prompts"][1];
    const PromptAnalysis& r = result.prompts[1];
    QCOMPARE(p["prompt_len"].get<std::int64_t>(), r.promptLen);
    QCOMPARE(p["num_tokens"].get<std::int64_t>(), r.tokens);
    QCOMPARE(p["num_heads"].get<int>(), r.heads);
    QCOMPARE(p["layer_names"].get<std::vector<std::string>>(), r.layers);
    QCOMPARE(p["divergence_positions"].get<std::vector<std::int64_t>>(), std::vector<std::int64_t>{31 + 4});
    for (const char* name : {"k_cos", "v_cos", "k_linf", "v_linf", "k_l2", "v_l2", "base_k_linf", "base_v_linf",
                             "base_k_l2", "base_v_l2"}) {
        const auto& m = p["metrics"][name];
        QCOMPARE(m.size(), r.layers.size());
        QCOMPARE(m[0].size(), std::size_t(r.tokens));
        QCOMPARE(m[0][0].size(), std::size_t(r.heads));
    }
    int nulls = 0;
    for (std::size_t l = 0; l < r.layers.size(); ++l)
        for (std::int64_t t = 0; t < r.tokens; ++t)
            for (int h = 0; h < r.heads; ++h) {
                const auto& cell = p["metrics"]["k_linf"][l][std::size_t(t)][std::size_t(h)];
                const float v = r.value(Metric::KLinf, int(l), t, h);
                if (std::isnan(v)) {
                    QVERIFY(cell.is_null());
                    ++nulls;
                } else {
                    QCOMPARE(cell.get<float>(), v);  // shortest round-trip form is exact
                }
            }
    QVERIFY(nulls > 0);  // sliding-window layers and the last position have no data
    QCOMPARE(p["bc"]["k_bc"].size(), r.layers.size());
    QVERIFY(p["bc"]["k_bc"][0][0].is_null());  // outside the window
    const auto& a = j["aggregate"];
    QCOMPARE(a["num_generation_indices"].get<int>(), 12);
    QCOMPARE(a["combined_v_bc"].size(), r.layers.size());
    QCOMPARE(a["k_bc"][2].size(), std::size_t(12));
    QCOMPARE(jsonString("a\"b\\c\n\x01"), std::string("\"a\\\"b\\\\c\\n\\u0001\""));
}

void TestMetrics::layerSelection()
{
    auto reader = std::make_shared<BundleReader>(m_demo);
    AnalysisOptions options;
    options.layers = {"model.layers.2.self_attn"};
    options.prompts = {"prompt_2"};
    const AnalysisResult r = analyzeBundle(reader, options);
    QCOMPARE(r.prompts.size(), std::size_t(1));
    QCOMPARE(r.prompts[0].layers, options.layers);
    options.layers = {"model.layers.9.self_attn"};
    kvtest::expectBundleError([&] { analyzeBundle(reader, options); }, {"model.layers.9.self_attn", "not a layer"});
    options.layers = {};
    options.prompts = {"nope"};
    kvtest::expectBundleError([&] { analyzeBundle(reader, options); }, {"/prompts/nope", "no such prompt"});
}

QTEST_APPLESS_MAIN(TestMetrics)
#include "tst_metrics.moc"
