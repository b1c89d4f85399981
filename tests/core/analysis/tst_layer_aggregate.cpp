// One layer of the three-way prompts pooled into the aggregate BCs (analysis/layer_aggregate.h),
// against a double-precision reference written here from the definitions: by generation index
// (every pooled prompt's token at promptLen + g) and combined (every token of every prompt), the
// reference tool's BC on shared equal-width bins (metric_reference.h's referenceBc) and BC
// against the noise floor (fixed log bins: the float32 bits >> 20). The errors are
// |reference - x| in float32, as the comparison defines them. Edge cases: no prompt pooled, one
// prompt, several of different prompt lengths, absent and NaN cells, a prompt not compared, a
// token pooled with an earlier prompt, the windowed second pass and a team of threads.

#include "analysis/bc_needs.h"
#include "analysis/layer_aggregate.h"
#include "analysis/layer_comparison.h"
#include "metric_reference.h"
#include "test_support.h"

#include <QTest>

#include <bit>
#include <cmath>
#include <map>
#include <memory>
#include <numeric>
#include <random>

using namespace kvscope;
using namespace kvtest;

namespace {

constexpr int kHeads = 2, kDim = 4, kLayers = 2, kLayer = 1;  // layer 0 is never touched

// One prompt of a case: its length, which tokens each side lacks, where a NaN lies.
struct PromptCase {
    std::int64_t promptLen = 3;
    std::int64_t tokens = 6;
    std::uint32_t seed = 1;
    std::vector<std::int64_t> actualAbsent;  // positions the engine does not hold
    std::int64_t nanToken = -1;              // engine V (head 1, dim 2) NaN at this token
    bool compared = true;                    // its sides read (LayerSides::ok)
    std::vector<std::uint8_t> pooledElsewhere;
    // Hand-worked values: the reference 0, every base value `fixedBase`, every engine value
    // `fixedActual` (so every error is exactly that value); NaN: random values.
    float fixedBase = std::nanf("");
    float fixedActual = std::nanf("");
};

PromptCase make(std::int64_t promptLen, std::int64_t tokens, std::uint32_t seed, std::vector<std::int64_t> actualAbsent = {},
                std::int64_t nanToken = -1, bool compared = true)
{
    PromptCase c;
    c.promptLen = promptLen;
    c.tokens = tokens;
    c.seed = seed;
    c.actualAbsent = std::move(actualAbsent);
    c.nanToken = nanToken;
    c.compared = compared;
    return c;
}

// [side: reference, actual, base][part] values [head][position][dim], and presence [side][position].
struct PromptValues {
    std::array<std::array<std::vector<float>, 2>, 3> values;
    std::array<std::vector<std::uint8_t>, 3> present;
    std::int64_t promptLen = 0, tokens = 0;
    float at(int side, KvPart part, int h, std::int64_t t, int d) const
    {
        return values[std::size_t(side)][std::size_t(part)][(std::size_t(h) * std::size_t(tokens) + std::size_t(t)) * kDim +
                                                            std::size_t(d)];
    }
};

LayerSource sourceOf(const std::array<std::vector<float>, 2>& parts, const std::vector<std::uint8_t>& present,
                     std::int64_t seq)
{
    LayerSource s = LayerSource::absent(kHeads, seq, HeadDims(kDim), 1);
    std::array<std::shared_ptr<RawTensor>, 2> tensors;
    for (KvPart part : {KvPart::K, KvPart::V}) {
        tensors[std::size_t(part)] =
            std::make_shared<RawTensor>(RawTensor::fromFloat(DType::Float32, {kHeads, seq, kDim}, parts[std::size_t(part)]));
        s.storage.push_back(tensors[std::size_t(part)]);
    }
    for (std::int64_t p = 0; p < seq; ++p) {
        if (!present[std::size_t(p)])
            continue;
        for (KvPart part : {KvPart::K, KvPart::V})
            s.runs(part, p)[0] = {tensors[std::size_t(part)].get(), p * kDim, seq * kDim};
        s.present[std::size_t(p)] = 1;
    }
    return s;
}

PromptValues makeValues(const PromptCase& c)
{
    PromptValues v;
    v.promptLen = c.promptLen;
    v.tokens = c.tokens;
    std::mt19937 rng(c.seed);
    std::normal_distribution<float> n01;
    const std::size_t size = std::size_t(kHeads) * std::size_t(c.tokens) * kDim;
    for (KvPart part : {KvPart::K, KvPart::V}) {
        auto& ref = v.values[0][std::size_t(part)];
        auto& actual = v.values[1][std::size_t(part)];
        auto& base = v.values[2][std::size_t(part)];
        for (std::size_t i = 0; i < size; ++i) {
            ref.push_back(n01(rng));
            base.push_back(ref.back() + 0.004f * n01(rng));
            actual.push_back(ref.back() + 0.01f * n01(rng));
            if (!std::isnan(c.fixedBase)) {
                ref.back() = 0;
                base.back() = c.fixedBase;
                actual.back() = c.fixedActual;
            }
        }
    }
    if (c.nanToken >= 0)
        v.values[1][std::size_t(KvPart::V)][(std::size_t(1) * std::size_t(c.tokens) + std::size_t(c.nanToken)) * kDim + 2] =
            std::nanf("");
    for (auto& p : v.present)
        p.assign(std::size_t(c.tokens), 1);
    for (std::int64_t t : c.actualAbsent)
        v.present[1][std::size_t(t)] = 0;
    return v;
}

// Everything aggregateLayer reads, made the way the analyser makes it (analyzer.cpp): each
// prompt compared with the stats pooling needs, the aggregate allocated NaN.
struct Setup {
    std::vector<PromptCase> cases;
    std::vector<PromptValues> values;
    AnalysisResult result;
    std::vector<LayerSides> sides;
    std::vector<TokenErrorStats> stats;
    std::vector<int> pooled;
    BcNeeds needs;

    Setup(std::vector<PromptCase> promptCases, std::vector<int> pooledPrompts, BcNeeds bcNeeds = {})
        : cases(std::move(promptCases))
        , pooled(std::move(pooledPrompts))
        , needs(bcNeeds)
    {
        AggregateBc agg;
        agg.generationCount = std::numeric_limits<std::int64_t>::max();
        for (int i : pooled)
            agg.generationCount = std::min(agg.generationCount, cases[std::size_t(i)].tokens - cases[std::size_t(i)].promptLen);
        if (pooled.empty())
            agg.generationCount = 0;
        const std::size_t cells = std::size_t(kLayers) * std::size_t(agg.generationCount);
        for (KvPart part : {KvPart::K, KvPart::V}) {
            agg.bc[std::size_t(part)].assign(cells, std::nanf(""));
            agg.bcVsNoise[std::size_t(part)].assign(cells, std::nanf(""));
            agg.combined[std::size_t(part)].assign(kLayers, std::nanf(""));
            agg.combinedVsNoise[std::size_t(part)].assign(kLayers, std::nanf(""));
        }
        result.aggregate = agg;
        stats.resize(cases.size());
        for (std::size_t i = 0; i < cases.size(); ++i) {
            const PromptCase& c = cases[i];
            values.push_back(makeValues(c));
            PromptAnalysis p = emptyPrompt(kLayers, c.tokens, kHeads, true);
            p.id = "p" + std::to_string(i);
            p.promptLen = c.promptLen;
            p.layerDtypes.assign(kLayers, DType::Float32);
            result.prompts.push_back(std::move(p));
            LayerSides s;
            const PromptValues& v = values.back();
            s.reference = sourceOf(v.values[0], v.present[0], c.tokens);
            s.actual = sourceOf(v.values[1], v.present[1], c.tokens);
            s.base = sourceOf(v.values[2], v.present[2], c.tokens);
            s.ok = c.compared;
            sides.push_back(std::move(s));
        }
        for (std::size_t i = 0; i < cases.size(); ++i) {
            if (!sides[i].ok)
                continue;
            stats[i].keepCounts = pooled.size() > 1 && (needs.perToken || needs.perTokenVsNoise);
            stats[i].kept = {cases[i].promptLen, cases[i].promptLen + agg.generationCount};
            stats[i].pooledElsewhere = cases[i].pooledElsewhere;
            std::vector<NonFiniteCell> nonFinite;
            const LayerRows base(sides[i].base);
            compareLayer(sides[i].reference, sides[i].actual, &base, kLayer, result.prompts[i], nonFinite, &stats[i],
                         nullptr, needs);
        }
    }
    const AggregateBc& aggregate() const { return *result.aggregate; }
};

// ---- the reference, in double from the definitions ----

// The errors of token t of one prompt and part: base = |ref - base|, actual = |ref - actual|
// (float32 subtraction, as defined), or nothing where a side lacks t or any value is not finite.
bool tokenErrors(const PromptValues& v, KvPart part, std::int64_t t, std::vector<double>& base, std::vector<double>& actual)
{
    if (!v.present[0][std::size_t(t)] || !v.present[1][std::size_t(t)] || !v.present[2][std::size_t(t)])
        return false;
    std::vector<double> b, a;
    for (int h = 0; h < kHeads; ++h)
        for (int d = 0; d < kDim; ++d) {
            const float r = v.at(0, part, h, t, d), x = v.at(1, part, h, t, d), e = v.at(2, part, h, t, d);
            if (!std::isfinite(r) || !std::isfinite(x) || !std::isfinite(e))
                return false;
            b.push_back(double(std::fabs(r - e)));
            a.push_back(double(std::fabs(r - x)));
        }
    base.insert(base.end(), b.begin(), b.end());
    actual.insert(actual.end(), a.begin(), a.end());
    return true;
}

// BC against the noise floor: bins of eight per octave read from the bits (bits >> 20),
// p = base counts / base total, q likewise; NaN when either set is empty.
double referenceNoiseBc(const std::vector<double>& base, const std::vector<double>& actual)
{
    if (base.empty() || actual.empty())
        return std::nan("");
    std::map<std::uint32_t, double> p, q;
    for (double e : base)
        p[std::bit_cast<std::uint32_t>(float(e)) >> 20] += 1.0 / double(base.size());
    for (double e : actual)
        q[std::bit_cast<std::uint32_t>(float(e)) >> 20] += 1.0 / double(actual.size());
    double bc = 0;
    for (const auto& [bin, pb] : p)
        if (q.count(bin))
            bc += std::sqrt(pb * q[bin]);
    return std::min(1.0, bc);
}

struct Expected {
    std::array<std::vector<double>, 2> bc, bcVsNoise;  // [part][generation index]
    std::array<double, 2> combined{}, combinedVsNoise{};
};

Expected reference(const Setup& s)
{
    Expected e;
    const std::int64_t gCount = s.aggregate().generationCount;
    for (KvPart part : {KvPart::K, KvPart::V}) {
        const std::size_t pi = std::size_t(part);
        std::vector<double> allBase, allActual;
        for (int i : s.pooled) {
            if (!s.cases[std::size_t(i)].compared)
                continue;
            const PromptCase& c = s.cases[std::size_t(i)];
            for (std::int64_t t = 0; t < c.tokens; ++t)
                if (std::size_t(t) >= c.pooledElsewhere.size() || !c.pooledElsewhere[std::size_t(t)])
                    tokenErrors(s.values[std::size_t(i)], part, t, allBase, allActual);
        }
        e.combined[pi] = allBase.empty() ? std::nan("") : referenceBc(allBase, allActual);
        e.combinedVsNoise[pi] = referenceNoiseBc(allBase, allActual);
        for (std::int64_t g = 0; g < gCount; ++g) {
            std::vector<double> base, actual;
            for (int i : s.pooled) {
                const PromptCase& c = s.cases[std::size_t(i)];
                const std::int64_t t = c.promptLen + g;
                if (c.compared && (std::size_t(t) >= c.pooledElsewhere.size() || !c.pooledElsewhere[std::size_t(t)]))
                    tokenErrors(s.values[std::size_t(i)], part, t, base, actual);
            }
            e.bc[pi].push_back(base.empty() ? std::nan("") : referenceBc(base, actual));
            e.bcVsNoise[pi].push_back(referenceNoiseBc(base, actual));
        }
    }
    return e;
}

// A float written from a double: equal within float rounding, or both NaN.
bool same(float got, double want)
{
    if (std::isnan(want))
        return std::isnan(got);
    return std::abs(double(got) - want) <= 1e-6 * std::max(1.0, std::abs(want));
}

#define CHECK_SAME(got, want, what)                                                                                  \
    QVERIFY2(same(got, want), qPrintable(QStringLiteral("%1: got %2, want %3").arg(what).arg(double(got), 0, 'g', 9).arg(want, 0, 'g', 9)))

// Against the reference: each BC the setup's needs ask for; those they leave out NaN.
void checkAgainstReference(const Setup& s)
{
    const Expected e = reference(s);
    const AggregateBc& agg = s.aggregate();
    const std::size_t g0 = std::size_t(kLayer) * std::size_t(agg.generationCount);
    const double leftOut = std::nan("");
    for (KvPart part : {KvPart::K, KvPart::V}) {
        const std::size_t pi = std::size_t(part);
        const QString name = part == KvPart::K ? "K" : "V";
        CHECK_SAME(agg.combined[pi][kLayer], s.needs.countsPooled() ? e.combined[pi] : leftOut, name + " combined");
        CHECK_SAME(agg.combinedVsNoise[pi][kLayer], e.combinedVsNoise[pi], name + " combined vs noise");
        QVERIFY(std::isnan(agg.combined[pi][0]) && std::isnan(agg.combinedVsNoise[pi][0]));  // layer 0 untouched
        for (std::int64_t g = 0; g < agg.generationCount; ++g) {
            CHECK_SAME(agg.bc[pi][g0 + std::size_t(g)], s.needs.perToken ? e.bc[pi][std::size_t(g)] : leftOut,
                       name + " bc g=" + QString::number(g));
            CHECK_SAME(agg.bcVsNoise[pi][g0 + std::size_t(g)],
                       s.needs.perTokenVsNoise ? e.bcVsNoise[pi][std::size_t(g)] : leftOut,
                       name + " bcVsNoise g=" + QString::number(g));
            QVERIFY(std::isnan(agg.bc[pi][std::size_t(g)]) && std::isnan(agg.bcVsNoise[pi][std::size_t(g)]));
        }
    }
}

bool sameBits(const AggregateBc& a, const AggregateBc& b)
{
    for (std::size_t p = 0; p < 2; ++p)
        for (auto member : {&AggregateBc::bc, &AggregateBc::bcVsNoise, &AggregateBc::combined, &AggregateBc::combinedVsNoise}) {
            const std::vector<float>& x = (a.*member)[p];
            const std::vector<float>& y = (b.*member)[p];
            if (x.size() != y.size())
                return false;
            for (std::size_t i = 0; i < x.size(); ++i)
                if (std::bit_cast<std::uint32_t>(x[i]) != std::bit_cast<std::uint32_t>(y[i]))
                    return false;
        }
    return true;
}

}  // namespace

Q_DECLARE_METATYPE(std::vector<PromptCase>)
Q_DECLARE_METATYPE(std::vector<int>)

class TestLayerAggregate : public QObject {
    Q_OBJECT

private slots:
    void referenceHandWorked();
    void pooledHandWorked();
    void pooledAgainstReference_data();
    void pooledAgainstReference();
    void onePromptIsItsOwnBcs();
    void nothingPooledLeavesNaN();
    void indexNoPromptHoldsStaysNaN();
    void windowedAndTeamGiveTheSameBits();
    void bcsLeftOut_data();
    void bcsLeftOut();
    void unreadableWindowWritesNothing();
};

void TestLayerAggregate::referenceHandWorked()
{
    // The test's own noise-floor BC: 1 and 0.5 are one octave apart (bins 1016 and 1008);
    // base {1, 1}, actual {1, 0.5}: p = (1), q = (1/2, 1/2) -> sqrt(1/2). Disjoint: 0.
    QVERIFY(std::abs(referenceNoiseBc({1.0, 1.0}, {1.0, 0.5}) - std::sqrt(0.5)) < 1e-12);
    QCOMPARE(referenceNoiseBc({1.0}, {2.0}), 0.0);
    QVERIFY(std::isnan(referenceNoiseBc({}, {1.0})));
    // And the library's, on the same sets (the test's definition is the one it documents).
    LogHistogram b, a;
    const float base[] = {1.0f, 1.0f}, actual[] = {1.0f, 0.5f};
    b.add(base, 2);
    a.add(actual, 2);
    QVERIFY(std::abs(bcVsNoise(b, a) - std::sqrt(0.5)) < 1e-12);
}

void TestLayerAggregate::pooledHandWorked()
{
    // Two prompts of one generated token each (prompt lengths 1 and 2), every error known:
    // prompt 0: base errors 1, engine errors 1; prompt 1: base errors 1, engine errors 2, in
    // each of its 2 heads x 4 values, K and V alike.
    PromptCase same = make(1, 2, 61), worse = make(2, 3, 62);
    same.fixedBase = 1, same.fixedActual = 1;
    worse.fixedBase = 1, worse.fixedActual = 2;
    // Pooled: base {1 x 16}, engine {1 x 8, 2 x 8} at generation index 0. Shared bins over
    // [1, 2]: base all in bin 0, engine half in bin 0 and half in bin 99: BC = sqrt(1 x 1/2).
    // Noise floor: 1 and 2 are an octave apart, the same split: sqrt(1/2). Combined: every token
    // (the prefill too) holds its prompt's errors, 2 tokens of prompt 0 and 3 of prompt 1:
    // base {1 x 40}, engine {1 x 16, 2 x 24}: sqrt(1 x 16/40), both ways.
    Setup s({same, worse}, {0, 1});
    aggregateLayer(s.result, s.pooled, s.sides, s.stats, kLayer, *s.result.aggregate);
    const AggregateBc& agg = s.aggregate();
    QCOMPARE(agg.generationCount, std::int64_t(1));
    for (std::size_t part = 0; part < 2; ++part) {
        QVERIFY(std::abs(agg.bc[part][kLayer] - std::sqrt(0.5)) < 1e-6);
        QVERIFY(std::abs(agg.bcVsNoise[part][kLayer] - std::sqrt(0.5)) < 1e-6);
        QVERIFY(std::abs(agg.combined[part][kLayer] - std::sqrt(16.0 / 40)) < 1e-6);
        QVERIFY(std::abs(agg.combinedVsNoise[part][kLayer] - std::sqrt(16.0 / 40)) < 1e-6);
    }
    checkAgainstReference(s);
    // The worse prompt alone: base {1}, engine {2}: disjoint, 0 both ways.
    Setup alone({same, worse}, {1});
    aggregateLayer(alone.result, alone.pooled, alone.sides, alone.stats, kLayer, *alone.result.aggregate);
    for (std::size_t part = 0; part < 2; ++part) {
        QCOMPARE(alone.aggregate().bc[part][kLayer], 0.0f);
        QCOMPARE(alone.aggregate().bcVsNoise[part][kLayer], 0.0f);
        QCOMPARE(alone.aggregate().combined[part][kLayer], 0.0f);
        QCOMPARE(alone.aggregate().combinedVsNoise[part][kLayer], 0.0f);
    }
}

void TestLayerAggregate::pooledAgainstReference_data()
{
    QTest::addColumn<std::vector<PromptCase>>("cases");
    QTest::addColumn<std::vector<int>>("pooled");
    PromptCase a = make(3, 7, 11), b = make(5, 8, 12), c = make(2, 6, 13);
    QTest::newRow("two prompts") << std::vector<PromptCase>{a, b} << std::vector<int>{0, 1};
    QTest::newRow("three prompts, different prompt lengths") << std::vector<PromptCase>{a, b, c} << std::vector<int>{0, 1, 2};
    QTest::newRow("only some prompts pooled") << std::vector<PromptCase>{a, b, c} << std::vector<int>{0, 2};
    PromptCase absent = b;
    absent.actualAbsent = {1, 6};  // a prefill token and generation index 1
    QTest::newRow("absent engine positions") << std::vector<PromptCase>{a, absent} << std::vector<int>{0, 1};
    PromptCase nan = a;
    nan.nanToken = 4;  // V of generation index 1 NaN; its K still counts
    QTest::newRow("NaN cell") << std::vector<PromptCase>{nan, b, c} << std::vector<int>{0, 1, 2};
    PromptCase notCompared = c;
    notCompared.compared = false;
    QTest::newRow("a prompt not compared") << std::vector<PromptCase>{a, b, notCompared} << std::vector<int>{0, 1, 2};
    PromptCase shared = b;
    shared.pooledElsewhere = {1, 1, 0, 0, 0, 0, 1, 0};  // prefix blocks and generation index 1 counted elsewhere
    QTest::newRow("tokens pooled with an earlier prompt") << std::vector<PromptCase>{a, shared} << std::vector<int>{0, 1};
}

void TestLayerAggregate::pooledAgainstReference()
{
    QFETCH(std::vector<PromptCase>, cases);
    QFETCH(std::vector<int>, pooled);
    Setup s(cases, pooled);
    aggregateLayer(s.result, s.pooled, s.sides, s.stats, kLayer, *s.result.aggregate);
    checkAgainstReference(s);
    // The values are BCs: within [0, 1] where written.
    for (const auto& v : s.aggregate().bc)
        for (float x : v)
            QVERIFY(std::isnan(x) || (x >= 0 && x <= 1));
}

void TestLayerAggregate::onePromptIsItsOwnBcs()
{
    // One prompt: each generation index is one token, whose BCs are the comparison's own.
    Setup s({make(4, 9, 21, {})}, {0});
    aggregateLayer(s.result, s.pooled, s.sides, s.stats, kLayer, *s.result.aggregate);
    checkAgainstReference(s);
    const AggregateBc& agg = s.aggregate();
    const PromptAnalysis& p = s.result.prompts[0];
    for (KvPart part : {KvPart::K, KvPart::V})
        for (std::int64_t g = 0; g < agg.generationCount; ++g) {
            const std::size_t at = std::size_t(kLayer * agg.generationCount + g);
            QCOMPARE(agg.bc[std::size_t(part)][at], p.bcValue(part, kLayer, p.promptLen + g));
            QCOMPARE(agg.bcVsNoise[std::size_t(part)][at], p.bcVsNoiseValue(part, kLayer, p.promptLen + g));
        }
}

void TestLayerAggregate::nothingPooledLeavesNaN()
{
    // No prompt pooled, and every pooled prompt not compared: nothing written.
    for (const auto& [cases, pooled] :
         std::vector<std::pair<std::vector<PromptCase>, std::vector<int>>>{{{make(3, 6, 1)}, {}},
                                                                          {{make(3, 6, 1, {}, -1, false), make(3, 7, 2, {}, -1, false)}, {0, 1}}}) {
        Setup s(cases, pooled);
        aggregateLayer(s.result, s.pooled, s.sides, s.stats, kLayer, *s.result.aggregate);
        for (std::size_t p = 0; p < 2; ++p)
            for (const auto* arrays : {&s.aggregate().bc[p], &s.aggregate().bcVsNoise[p], &s.aggregate().combined[p],
                                       &s.aggregate().combinedVsNoise[p]})
                for (float x : *arrays)
                    QVERIFY(std::isnan(x));
        checkAgainstReference(s);
    }
}

void TestLayerAggregate::indexNoPromptHoldsStaysNaN()
{
    // Generation index 1 absent from the engine in both prompts: no data there (NaN, not BC 1),
    // the other indices and the combined BCs as the reference has them.
    PromptCase a = make(3, 6, 31, {4}), b = make(2, 5, 32, {3});
    Setup s({a, b}, {0, 1});
    aggregateLayer(s.result, s.pooled, s.sides, s.stats, kLayer, *s.result.aggregate);
    const AggregateBc& agg = s.aggregate();
    for (KvPart part : {KvPart::K, KvPart::V}) {
        QVERIFY(std::isnan(agg.bc[std::size_t(part)][std::size_t(kLayer * agg.generationCount + 1)]));
        QVERIFY(std::isnan(agg.bcVsNoise[std::size_t(part)][std::size_t(kLayer * agg.generationCount + 1)]));
    }
    checkAgainstReference(s);
}

void TestLayerAggregate::windowedAndTeamGiveTheSameBits()
{
    const std::vector<PromptCase> cases{make(3, 9, 41, {2}), make(5, 10, 42, {}), make(1, 7, 43, {}, 3)};
    Setup whole(cases, {0, 1, 2});
    aggregateLayer(whole.result, whole.pooled, whole.sides, whole.stats, kLayer, *whole.result.aggregate);
    checkAgainstReference(whole);

    Setup teamed(cases, {0, 1, 2});
    WorkTeam team(2);
    aggregateLayer(teamed.result, teamed.pooled, teamed.sides, teamed.stats, kLayer, *teamed.result.aggregate, &team);
    QVERIFY(sameBits(whole.aggregate(), teamed.aggregate()));

    // The second pass a window of 4 tokens at a time.
    Setup windowed(cases, {0, 1, 2});
    WindowedLayerPooling pooling(windowed.result, windowed.pooled, std::vector<char>{1, 1, 1}, windowed.stats, kLayer,
                                 *windowed.result.aggregate);
    QVERIFY(pooling.needsSides());
    for (std::int64_t begin = 0; begin < 10; begin += 4)
        pooling.count(windowed.sides, {begin, begin + 4});
    QVERIFY(pooling.finish());
    QVERIFY(sameBits(whole.aggregate(), windowed.aggregate()));
}

Q_DECLARE_METATYPE(kvscope::BcNeeds)

void TestLayerAggregate::bcsLeftOut_data()
{
    QTest::addColumn<BcNeeds>("needs");
    QTest::addColumn<int>("prompts");
    const std::pair<const char*, BcNeeds> needs[] = {
        {"kvscope analyze's summary", BcNeeds::summary(false)},
        {"kvscope analyze --seed-bc", BcNeeds::summary(true)},
        {"kvscope check", BcNeeds::verdict(false)},
        {"kvscope check --seed-bc", BcNeeds::verdict(true)},
        {"the reference tool's per token only", {.perToken = true, .combined = false, .perTokenVsNoise = false}},
        {"against the noise floor per token only", {.perToken = false, .combined = false, .perTokenVsNoise = true}}};
    for (const auto& [name, n] : needs)
        for (int prompts : {1, 3})
            QTest::newRow(qPrintable(QString("%1, %2 prompt(s)").arg(name).arg(prompts))) << n << prompts;
}

void TestLayerAggregate::bcsLeftOut()
{
    // What is asked for is the reference's, whole and a window at a time; what is not stays NaN,
    // per token too, and without a second pass nothing is read again.
    QFETCH(BcNeeds, needs);
    QFETCH(int, prompts);
    std::vector<PromptCase> cases{make(3, 9, 61, {2}), make(5, 10, 62, {}), make(1, 7, 63, {}, 3)};
    cases.resize(std::size_t(prompts));
    std::vector<int> pooled(cases.size());
    std::iota(pooled.begin(), pooled.end(), 0);
    Setup whole(cases, pooled, needs);
    aggregateLayer(whole.result, whole.pooled, whole.sides, whole.stats, kLayer, *whole.result.aggregate, nullptr,
                   nullptr, needs);
    checkAgainstReference(whole);
    // Per token: the comparison's with every BC asked for (tst_layer_comparison checks those), or NaN.
    const Setup every(cases, pooled);
    for (std::size_t i = 0; i < cases.size(); ++i) {
        const PromptAnalysis& p = whole.result.prompts[i];
        const PromptAnalysis& all = every.result.prompts[i];
        for (KvPart part : {KvPart::K, KvPart::V})
            for (std::int64_t t = 0; t < p.tokens; ++t) {
                const float bc = all.bcValue(part, kLayer, t), vsNoise = all.bcVsNoiseValue(part, kLayer, t);
                QCOMPARE(std::bit_cast<std::uint32_t>(p.bcValue(part, kLayer, t)),
                         std::bit_cast<std::uint32_t>(needs.perToken ? bc : std::nanf("")));
                QCOMPARE(std::bit_cast<std::uint32_t>(p.bcVsNoiseValue(part, kLayer, t)),
                         std::bit_cast<std::uint32_t>(needs.perTokenVsNoise ? vsNoise : std::nanf("")));
            }
    }

    Setup windowed(cases, pooled, needs);
    WindowedLayerPooling pooling(windowed.result, windowed.pooled, std::vector<char>(cases.size(), 1), windowed.stats,
                                 kLayer, *windowed.result.aggregate, nullptr, nullptr, needs);
    QCOMPARE(pooling.needsSides(), needs.countsPooled());
    for (std::int64_t begin = 0; begin < 10 && pooling.needsSides(); begin += 4)
        pooling.count(windowed.sides, {begin, begin + 4});
    QVERIFY(pooling.finish());
    QVERIFY(sameBits(whole.aggregate(), windowed.aggregate()));
}

void TestLayerAggregate::unreadableWindowWritesNothing()
{
    Setup s({make(3, 7, 51, {}), make(3, 8, 52, {})}, {0, 1});
    WindowedLayerPooling pooling(s.result, s.pooled, std::vector<char>{1, 1}, s.stats, kLayer, *s.result.aggregate);
    pooling.count(s.sides, PositionRange::all());
    QVERIFY(!pooling.finish(true));
    for (std::size_t p = 0; p < 2; ++p)
        for (float x : s.aggregate().combined[p])
            QVERIFY(std::isnan(x));
}

QTEST_APPLESS_MAIN(TestLayerAggregate)
#include "tst_layer_aggregate.moc"
