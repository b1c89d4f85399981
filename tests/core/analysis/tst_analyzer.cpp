// The whole-bundle analysis: aggregation across prompts equals pooling the raw errors,
// progress and cancellation, prompt and layer selection.

#include "analysis/analyzer.h"
#include "analysis/layer_comparison.h"
#include "analysis/layer_selection.h"
#include "kv/capture_loader.h"
#include "metric_reference.h"
#include "test_support.h"

#include <QTemporaryDir>
#include <QTest>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cmath>
#include <mutex>

using namespace kvscope;
using namespace kvtest;

class TestAnalyzer : public QObject {
    Q_OBJECT

private slots:
    void initTestCase();
    void aggregationEqualsPooledErrors_data();
    void aggregationEqualsPooledErrors();
    void singlePromptAggregate();
    void fingerprintsOnlyWhenAsked();
    void bcsOnlyAsked();
    void progressAndCancellation();
    void layerSelection();
    void layerSelectionSyntax();

private:
    QTemporaryDir m_dir;
    std::string m_demo;
    std::string m_mixed;  // the same, its sliding layers with head size 16 (the full ones 32)
    std::string m_mixedHeads;  // the same, its sliding layers with 1 KV head (replicated on TP 2; the full ones 4)
};

void TestAnalyzer::initTestCase()
{
    m_demo = m_dir.filePath("demo.h5").toStdString();
    writeSmallCapture(m_demo);
    m_mixed = m_dir.filePath("mixed.h5").toStdString();
    writeSmallCapture(m_mixed, 16);
    m_mixedHeads = m_dir.filePath("mixed_heads.h5").toStdString();
    writeSmallCapture(m_mixedHeads, 0, 1);
}

void TestAnalyzer::aggregationEqualsPooledErrors_data()
{
    QTest::addColumn<QStringList>("prompts");
    QTest::addColumn<int>("mixed");  // 0, 1: groups of different head sizes, 2: of different head counts
    QTest::newRow("three prompts") << QStringList() << 0;
    // One prompt takes a shorter path (its tokens' own BCs); it must agree all the same.
    QTest::newRow("one prompt") << QStringList{"prompt_1"} << 0;
    // Groups of different head sizes: each layer compared at its own.
    QTest::newRow("head sizes 16 and 32") << QStringList() << 1;
    // Groups of different KV head counts (one replicated, one partitioned over TP 2): each
    // layer compared over its own heads, the others absent.
    QTest::newRow("1 and 4 KV heads") << QStringList() << 2;
}

void TestAnalyzer::aggregationEqualsPooledErrors()
{
    QFETCH(QStringList, prompts);
    QFETCH(int, mixed);
    auto reader = std::make_shared<BundleReader>(mixed == 2 ? m_mixedHeads : mixed == 1 ? m_mixed : m_demo);
    AnalysisOptions options;
    for (const QString& id : prompts)
        options.prompts.push_back(id.toStdString());
    const AnalysisResult result = analyzeBundle(reader, options);
    if (mixed == 1)
        for (const PromptAnalysis& p : result.prompts) {
            QCOMPARE(p.layerDims.size(), std::size_t(4));
            QCOMPARE(p.layerDims[0], HeadDims(16));  // sliding
            QCOMPARE(p.layerDims[1], HeadDims(32));  // full
        }
    if (mixed == 2)
        for (const PromptAnalysis& p : result.prompts) {
            QCOMPARE(p.heads, 4);
            QCOMPARE(p.layerHeads, (std::vector<int>{1, 4, 1, 4}));
            for (std::int64_t t = 0; t < p.tokens; ++t)
                for (int h = 1; h < 4; ++h)  // a sliding layer's heads past its one: absent
                    QVERIFY(std::isnan(p.value(Metric::KLinf, 2, t, h)) && std::isnan(p.value(Metric::VCos, 0, t, h)));
            QVERIFY(!p.suspects.empty());  // the fault: layer 3, head 1
            QCOMPARE(p.suspects.front().firstLayer, std::string("model.layers.3.self_attn"));
            QCOMPARE(p.suspects.front().heads, std::vector<int>{1});
        }
    const int pooled = prompts.isEmpty() ? 3 : int(prompts.size());
    QVERIFY(result.aggregate);
    const AggregateBc& agg = *result.aggregate;
    QCOMPARE(agg.promptIds.size(), std::size_t(pooled));
    QCOMPARE(agg.generationCount, std::int64_t(12));  // every prompt has 12 decode positions
    QCOMPARE(agg.divergenceCounts[4], pooled);         // all three diverged at generation index 4
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
            double faultyWorst = 1;  // the fault is in layer 3, from decode step 6
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
                const float noise = agg.bcVsNoise[std::size_t(part)][l * std::size_t(agg.generationCount) + std::size_t(g)];
                QVERIFY2(std::abs(noise - referenceBcVsNoise(pb, pt)) < 1e-6,
                         qPrintable(QString("vs noise, layer %1 g %2: %3 vs %4").arg(l).arg(g).arg(noise).arg(referenceBcVsNoise(pb, pt))));
                if (l == 3 && part == KvPart::K && g >= 6)
                    faultyWorst = std::min(faultyWorst, double(noise));
            }
            for (std::size_t i = 0; i < result.prompts.size(); ++i)
                for (std::int64_t t = 0; t < base[i].seq; ++t)
                    if (held(i, t)) {
                        const auto eb = errors(base[i], expected[i], t, part), et = errors(base[i], actual[i], t, part);
                        allBase.insert(allBase.end(), eb.begin(), eb.end());
                        allTarget.insert(allTarget.end(), et.begin(), et.end());
                    }
            QVERIFY(std::abs(agg.combined[std::size_t(part)][l] - referenceBc(allBase, allTarget)) < 1e-6);
            QVERIFY(std::abs(agg.combinedVsNoise[std::size_t(part)][l] - referenceBcVsNoise(allBase, allTarget)) < 1e-6);
            // Per (prompt, token) too.
            for (std::size_t i = 0; i < result.prompts.size(); ++i)
                for (std::int64_t t = 0; t < base[i].seq; ++t) {
                    const float got = result.prompts[i].bcVsNoiseValue(part, int(l), t);
                    if (!held(i, t)) {
                        QVERIFY(std::isnan(got));
                        continue;
                    }
                    const auto eb = errors(base[i], expected[i], t, part), et = errors(base[i], actual[i], t, part);
                    QVERIFY(std::abs(got - referenceBcVsNoise(eb, et)) < 1e-6);
                }
            if (l == 3 && part == KvPart::K)
                QVERIFY2(faultyWorst < 0.95, qPrintable(QString("one faulty head of four: %1").arg(faultyWorst)));
        }
    }
    // The last generation index is the never-written last position: no data anywhere.
    QVERIFY(std::isnan(agg.bc[0][std::size_t(agg.generationCount) - 1]));
}

void TestAnalyzer::singlePromptAggregate()
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

void TestAnalyzer::fingerprintsOnlyWhenAsked()
{
    // By default each layer's references are fingerprinted as read (in windows: the same value
    // as a whole layer's); without, the fingerprints stay 0 and every metric is the same.
    auto reader = std::make_shared<BundleReader>(m_demo);
    AnalysisOptions options;
    options.windowTokens = 4;  // several windows a layer
    const AnalysisResult with = analyzeBundle(reader, options);
    options.fingerprints = false;
    const AnalysisResult without = analyzeBundle(reader, options);
    const CaptureLoader loader(reader);
    QCOMPARE(with.prompts.size(), without.prompts.size());
    for (std::size_t i = 0; i < with.prompts.size(); ++i) {
        const PromptAnalysis& a = with.prompts[i];
        const PromptAnalysis& b = without.prompts[i];
        for (int l = 0; l < int(a.layers.size()); ++l) {
            const std::size_t at = std::size_t(l);
            QCOMPARE(a.referenceHashes[0][at],
                     loader.referenceSource(a.id, ReferenceRole::Expected, a.layers[at]).contentHash());
            QCOMPARE(b.referenceHashes[0][at], std::uint64_t(0));
            QCOMPARE(b.referenceHashes[1][at], std::uint64_t(0));
            for (int m = 0; m < kMetricCount; ++m)
                for (std::int64_t t = 0; t < a.tokens; ++t)
                    for (int h = 0; h < a.heads; ++h) {
                        const float x = a.value(Metric(m), l, t, h), y = b.value(Metric(m), l, t, h);
                        QVERIFY(x == y || (std::isnan(x) && std::isnan(y)));
                    }
        }
    }
}

void TestAnalyzer::bcsOnlyAsked()
{
    // Each BC a command asks for is what the whole analysis gives, bit for bit, whole layers and
    // in windows (where the second pass reads the other windows again, or not at all); those it
    // leaves out stay NaN; every other metric is the same.
    auto reader = std::make_shared<BundleReader>(m_demo);
    const auto bits = [](float x) { return std::bit_cast<std::uint32_t>(x); };
    const auto sameOrNaN = [&](const std::vector<float>& got, const std::vector<float>& all, bool asked) {
        if (got.size() != all.size())
            return false;
        for (std::size_t i = 0; i < got.size(); ++i)
            if (bits(got[i]) != bits(asked ? all[i] : std::nanf("")))
                return false;
        return true;
    };
    for (const std::int64_t window : {std::int64_t(0), std::int64_t(4)}) {
        AnalysisOptions options;
        options.windowTokens = window;
        const AnalysisResult all = analyzeBundle(reader, options);
        for (const BcNeeds needs : {BcNeeds::summary(false), BcNeeds::summary(true), BcNeeds::verdict(false), BcNeeds::verdict(true)}) {
            options.bcs = needs;
            const AnalysisResult some = analyzeBundle(reader, options);
            const AggregateBc &a = *some.aggregate, &b = *all.aggregate;
            for (std::size_t part = 0; part < 2; ++part) {
                QVERIFY(sameOrNaN(a.combinedVsNoise[part], b.combinedVsNoise[part], true));
                QVERIFY(sameOrNaN(a.combined[part], b.combined[part], needs.countsPooled()));
                QVERIFY(sameOrNaN(a.bc[part], b.bc[part], needs.perToken));
                QVERIFY(sameOrNaN(a.bcVsNoise[part], b.bcVsNoise[part], needs.perTokenVsNoise));
                for (const auto* values : {&b.combined[part], &b.combinedVsNoise[part], &b.bc[part], &b.bcVsNoise[part]})
                    QVERIFY(std::any_of(values->begin(), values->end(), [](float x) { return !std::isnan(x); }));
            }
            QCOMPARE(some.prompts.size(), all.prompts.size());
            for (std::size_t i = 0; i < all.prompts.size(); ++i) {
                const PromptAnalysis &p = some.prompts[i], &q = all.prompts[i];
                for (KvPart part : {KvPart::K, KvPart::V})
                    for (int l = 0; l < int(p.layers.size()); ++l)
                        for (std::int64_t t = 0; t < p.tokens; ++t) {
                            QCOMPARE(bits(p.bcValue(part, l, t)), bits(needs.perToken ? q.bcValue(part, l, t) : std::nanf("")));
                            QCOMPARE(bits(p.bcVsNoiseValue(part, l, t)),
                                     bits(needs.perTokenVsNoise ? q.bcVsNoiseValue(part, l, t) : std::nanf("")));
                        }
                for (int m = 0; m < kMetricCount; ++m)
                    for (int l = 0; l < int(p.layers.size()); ++l)
                        for (std::int64_t t = 0; t < p.tokens; ++t)
                            for (int h = 0; h < p.heads; ++h)
                                QCOMPARE(bits(p.value(Metric(m), l, t, h)), bits(q.value(Metric(m), l, t, h)));
            }
        }
    }
}

void TestAnalyzer::progressAndCancellation()
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

void TestAnalyzer::layerSelection()
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

void TestAnalyzer::layerSelectionSyntax()
{
    const std::vector<std::string> layers{"a.0", "a.1", "a.2", "a.3", "a.4"};
    using L = std::vector<std::string>;
    QCOMPARE(parseLayerSelection("0-2,4", layers), (L{"a.0", "a.1", "a.2", "a.4"}));
    QCOMPARE(parseLayerSelection("a.3,1", layers), (L{"a.3", "a.1"}));
    QCOMPARE(parseLayerSelection("3,,", layers), (L{"a.3"}));
    for (const char* bad : {"5", "2-1", "0-9", "x", "1x", "-1"})
        QVERIFY_THROWS_EXCEPTION(std::invalid_argument, parseLayerSelection(bad, layers));
    QVERIFY_THROWS_EXCEPTION(std::invalid_argument, parseLayerSelection("0", {}));
}

QTEST_APPLESS_MAIN(TestAnalyzer)
#include "tst_analyzer.moc"
