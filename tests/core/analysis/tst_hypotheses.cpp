// The explanations the suspects test (analysis/hypotheses.h) on hand-made layers, and the RoPE
// settings they use (format/rope_settings.h) against rotations worked by hand.

#include "analysis/hypotheses.h"
#include "format/bundle_error.h"
#include "format/rope_settings.h"

#include "hand_layer.h"

#include <QTest>

#include <cmath>
#include <random>

using namespace kvscope;
using namespace kvtest::hand;

namespace {


// A two-way prompt of one layer whose metrics say every cell of `heads` is off (L2 1).
PromptAnalysis promptWithOff(const std::vector<int>& heads)
{
    PromptAnalysis p = twoWayPrompt();
    for (std::int64_t t = 0; t < kTokens; ++t)
        for (int h : heads)
            for (KvPart part : {KvPart::K, KvPart::V})
                p.metrics[std::size_t(metricFor(part, MetricKind::L2))][p.cell(0, t, h)] = 1.0f;
    return p;
}

std::vector<OffCell> offCells(const std::vector<int>& heads, bool kOnly = false)
{
    std::vector<OffCell> cells;
    for (std::int64_t t = 0; t < kTokens; ++t)
        for (int h : heads)
            for (KvPart part : {KvPart::K, KvPart::V})
                if (!kOnly || part == KvPart::K)
                    cells.push_back({t, h, part, 256.0f});
    return cells;
}

std::vector<Hypothesis> test(const PromptAnalysis& p, const std::vector<OffCell>& cells, const LayerKv& engine,
                             const LayerKv& reference, std::optional<RopeSettings> rope = std::nullopt)
{
    const KvCacheConfig cfg = config();
    const CellRatios ratios(p, nullptr);
    const SampledLayer sampledEngine = SampledLayer::of(engine), sampledReference = SampledLayer::of(reference);
    return testHypotheses({p, cfg, ratios, 0, cells, sampledEngine, sampledReference, rope, 2.0});
}

}  // namespace

class TestHypotheses : public QObject {
    Q_OBJECT

private slots:
    void ropeRotatesAsWorkedByHand();
    void ropeSettingsAreRead();
    void swappedHeadsAreFound();
    void aScaleIsMeasured();
    void aRopeOffsetIsFound();
    void aRopeOffsetIsFoundUnderScaling();
    void zerosAndUnrelatedData();
    void magnitudeFits();
    void freeFitsExplainNothingElse();
};

void TestHypotheses::ropeRotatesAsWorkedByHand()
{
    // dim 4, theta 100: pair 0 turns by p rad, pair 1 by p / 10 rad.
    RopeSettings neox{100.0, 0, true, 1.0, {}};
    const double in[4] = {1, 2, 3, 4};
    double out[4], back[4];
    applyRope(neox, 4, 1.0, false, in, out);
    // Halves: pairs (0, 2) and (1, 3).
    QVERIFY(std::fabs(out[0] - (1 * std::cos(1.0) - 3 * std::sin(1.0))) < 1e-12);
    QVERIFY(std::fabs(out[2] - (3 * std::cos(1.0) + 1 * std::sin(1.0))) < 1e-12);
    QVERIFY(std::fabs(out[1] - (2 * std::cos(0.1) - 4 * std::sin(0.1))) < 1e-12);
    QVERIFY(std::fabs(out[3] - (4 * std::cos(0.1) + 2 * std::sin(0.1))) < 1e-12);
    applyRope(neox, 4, 1.0, true, out, back);
    for (int i = 0; i < 4; ++i)
        QVERIFY(std::fabs(back[i] - in[i]) < 1e-12);
    // Interleaved pairs (0, 1) and (2, 3); a linear scaling of 2 halves the angles.
    RopeSettings gptj{100.0, 0, false, 2.0, {}};
    applyRope(gptj, 4, 2.0, false, in, out);
    QVERIFY(std::fabs(out[0] - (1 * std::cos(1.0) - 2 * std::sin(1.0))) < 1e-12);
    QVERIFY(std::fabs(out[1] - (2 * std::cos(1.0) + 1 * std::sin(1.0))) < 1e-12);
    // Partial rotary: only the first 2 values turn.
    RopeSettings partial{100.0, 2, true, 1.0, {}};
    applyRope(partial, 4, 1.0, false, in, out);
    QVERIFY(std::fabs(out[0] - (1 * std::cos(1.0) - 2 * std::sin(1.0))) < 1e-12);
    QCOMPARE(out[2], 3.0);
    QCOMPARE(out[3], 4.0);
}

void TestHypotheses::ropeSettingsAreRead()
{
    BundleMetadata m;
    QVERIFY(!ropeSettingsOf(m, "f.h5"));
    m.extra["rope"] = R"({"theta": 500000, "rotary_dim": 64, "style": "gptj", "scaling": {"type": "linear", "factor": 4}})";
    const std::optional<RopeSettings> r = ropeSettingsOf(m, "f.h5");
    QVERIFY(r);
    QCOMPARE(r->theta, 500000.0);
    QCOMPARE(r->rotaryDim, 64);
    QVERIFY(!r->neoxStyle);
    QCOMPARE(r->positionScale, 4.0);
    for (const char* bad : {"{", R"({"rotary_dim": 64})", R"({"theta": 1e4, "style": "other"})",
                            R"({"theta": 1e4, "scaling": {"type": "llama3", "factor": 8}})"}) {
        m.extra["rope"] = bad;
        try {
            ropeSettingsOf(m, "f.h5");
            QFAIL(bad);
        } catch (const BundleError& e) {
            QVERIFY2(QString(e.what()).contains("f.h5") && QString(e.what()).contains("rope"), e.what());
        }
    }
}

void TestHypotheses::swappedHeadsAreFound()
{
    const LayerKv reference = randomLayer(1);
    LayerKv engine = reference;
    for (std::int64_t t = 0; t < kTokens; ++t)
        for (auto* side : {&engine.k, &engine.v})
            std::swap_ranges(side->begin() + std::ptrdiff_t(engine.index(KvPart::K, 2, t)),
                             side->begin() + std::ptrdiff_t(engine.index(KvPart::K, 2, t) + kDim),
                             side->begin() + std::ptrdiff_t(engine.index(KvPart::K, 3, t)));
    const PromptAnalysis p = promptWithOff({2, 3});
    const std::vector<Hypothesis> h = test(p, offCells({2, 3}), engine, reference);
    // Rank 1 holds heads 2 and 3 in the wrong order: a head map, not another rank's shard.
    QCOMPARE(h.front().kind, std::string("head_swap"));
    QCOMPARE(h.front().parameter("head_2"), 3.0);
    QCOMPARE(h.front().parameter("head_3"), 2.0);
    QVERIFY(h.front().residualFloors < 0.01);
    QCOMPARE(h.front().explainedShare, 1.0);
}

void TestHypotheses::aScaleIsMeasured()
{
    const LayerKv reference = randomLayer(2);
    LayerKv engine = reference;
    for (std::int64_t t = 0; t < kTokens; ++t)
        for (int i = 0; i < kDim; ++i)
            engine.v[engine.index(KvPart::V, 1, t) + std::size_t(i)] *= 1.25f;
    const PromptAnalysis p = promptWithOff({1});
    std::vector<OffCell> cells;
    for (const OffCell& c : offCells({1}))
        if (c.part == KvPart::V)
            cells.push_back(c);
    const std::vector<Hypothesis> h = test(p, cells, engine, reference);
    QCOMPARE(h.front().kind, std::string("scale"));
    QVERIFY(std::fabs(h.front().parameter("factor") - 1.25) < 1e-6);
    QVERIFY(h.front().residualFloors < 0.01);
}

void TestHypotheses::aRopeOffsetIsFound()
{
    const RopeSettings rope{10000.0, 0, true, 1.0, {}};
    const LayerKv reference = randomLayer(3);
    LayerKv engine = reference;
    // K of every head rotated 5 positions further.
    for (std::int64_t t = 0; t < kTokens; ++t)
        for (int h = 0; h < kHeads; ++h) {
            double in[kDim], out[kDim];
            float* k = engine.k.data() + engine.index(KvPart::K, h, t);
            std::copy_n(k, kDim, in);
            applyRope(rope, kDim, 5.0, false, in, out);
            for (int i = 0; i < kDim; ++i)
                k[i] = float(out[i]);
        }
    const PromptAnalysis p = promptWithOff({0, 1, 2, 3});
    const std::vector<Hypothesis> h = test(p, offCells({0, 1, 2, 3}, true), engine, reference, rope);
    QCOMPARE(h.front().kind, std::string("rope_offset"));
    QCOMPARE(h.front().parameter("offset"), 5.0);
    // Without the rope settings no RoPE hypothesis is tried.
    for (const Hypothesis& x : test(p, offCells({0, 1, 2, 3}, true), engine, reference))
        QVERIFY(x.kind.rfind("rope", 0) != 0);
}

// The engine's K as the reference's un-rotated for t under `model` and rotated for position(t)
// under `engine` (RopeRotation against the formulas: tests/core/format/tst_rope_frequencies.cpp).
static LayerKv rotatedOtherwise(const LayerKv& reference, const RopeSettings& model, const RopeSettings& engine,
                         std::int64_t shift)
{
    LayerKv out = reference;
    RopeRotation undo(model, kDim, kTokens), redo(engine, kDim, kTokens);
    for (std::int64_t t = 0; t < kTokens; ++t) {
        undo.setPosition(double(t), true);
        redo.setPosition(double(t + shift));
        for (int h = 0; h < kHeads; ++h) {
            double in[kDim], raw[kDim], rotated[kDim];
            float* k = out.k.data() + out.index(KvPart::K, h, t);
            std::copy_n(k, kDim, in);
            undo.apply(in, raw);
            redo.apply(raw, rotated);
            for (int i = 0; i < kDim; ++i)
                k[i] = float(rotated[i]);
        }
    }
    return out;
}

void TestHypotheses::aRopeOffsetIsFoundUnderScaling()
{
    // llama3 and yarn (whose attention factor scales K) over an original context shorter than the
    // layer: K rotated 5 positions further is a rope_offset of 5; rotated without the scaling,
    // rope_unscaled.
    RopeSettings llama3{10000.0, 0, true, 1.0, {}};
    llama3.scaling.type = RopeScalingType::Llama3;
    llama3.scaling.factor = 8;
    llama3.scaling.lowFreqFactor = 1;
    llama3.scaling.highFreqFactor = 4;
    llama3.scaling.originalMaxPositions = 16;
    RopeSettings yarn{10000.0, 0, true, 1.0, {}};
    yarn.scaling.type = RopeScalingType::Yarn;
    yarn.scaling.factor = 8;
    yarn.scaling.originalMaxPositions = 16;
    yarn.scaling.attentionFactor = yarnAttentionFactor(8, 0, 0);
    const PromptAnalysis p = promptWithOff({0, 1, 2, 3});
    for (const RopeSettings& model : {llama3, yarn}) {
        const LayerKv reference = randomLayer(5);
        const std::vector<Hypothesis> shifted =
            test(p, offCells({0, 1, 2, 3}, true), rotatedOtherwise(reference, model, model, 5), reference, model);
        QCOMPARE(shifted.front().kind, std::string("rope_offset"));
        QCOMPARE(shifted.front().parameter("offset"), 5.0);
        QVERIFY(shifted.front().residualFloors < 0.01);
        RopeSettings plain = model;
        plain.scaling = RopeScaling{};
        const std::vector<Hypothesis> unscaled =
            test(p, offCells({0, 1, 2, 3}, true), rotatedOtherwise(reference, model, plain, 0), reference, model);
        QCOMPARE(unscaled.front().kind, std::string("rope_unscaled"));
        QVERIFY(unscaled.front().residualFloors < 0.01);
    }
}

void TestHypotheses::zerosAndUnrelatedData()
{
    const LayerKv reference = randomLayer(4);
    LayerKv zeros = reference, other = randomLayer(99);
    for (std::int64_t t = 0; t < kTokens; ++t)
        for (int i = 0; i < kDim; ++i)
            zeros.k[zeros.index(KvPart::K, 0, t) + std::size_t(i)] = zeros.v[zeros.index(KvPart::V, 0, t) + std::size_t(i)] = 0.0f;
    const PromptAnalysis p = promptWithOff({0});
    QCOMPARE(test(p, offCells({0}), zeros, reference).front().kind, std::string("zeros"));
    const std::vector<Hypothesis> h = test(p, offCells({0}), other, reference);
    const auto unrelated = std::find_if(h.begin(), h.end(), [](const Hypothesis& x) { return x.kind == "unrelated"; });
    QVERIFY(unrelated != h.end());
    QVERIFY(unrelated->residualFloors > 10);  // nothing in the reference is near another draw
    QVERIFY(h.front().residualFloors > 10);   // and nothing explains it
}

// Each magnitude fault (direction intact) on a hand-made layer: the free fit that models it
// explains it, with its parameters, and nothing exact does.
void TestHypotheses::magnitudeFits()
{
    const LayerKv reference = randomLayer(5);
    const auto kinds = [](const std::vector<Hypothesis>& h) {
        std::string all;
        for (const Hypothesis& x : h)
            all += x.kind + " ";
        return all;
    };
    // K of every head times a factor per token, 0.4-1.6x.
    LayerKv engine = reference;
    for (std::int64_t t = 0; t < kTokens; ++t)
        for (int h = 0; h < kHeads; ++h)
            for (int i = 0; i < kDim; ++i)
                engine.k[engine.index(KvPart::K, h, t) + std::size_t(i)] *= float(0.4 + 1.2 * double(t) / (kTokens - 1));
    const PromptAnalysis every = promptWithOff({0, 1, 2, 3});
    std::vector<Hypothesis> h = test(every, offCells({0, 1, 2, 3}, true), engine, reference);
    QCOMPARE(h.front().kind, std::string("token_scale"));
    QVERIFY(std::fabs(h.front().parameter("min") - 0.4) < 1e-6 && std::fabs(h.front().parameter("max") - 1.6) < 1e-6);
    QVERIFY(h.front().residualFloors < 0.01);
    // V of head 1 times a factor per channel, the same at every token.
    engine = reference;
    for (std::int64_t t = 0; t < kTokens; ++t)
        for (int i = 0; i < kDim; ++i)
            engine.v[engine.index(KvPart::V, 1, t) + std::size_t(i)] *= float(0.5 + i / 7.0);
    std::vector<OffCell> v1;
    for (const OffCell& c : offCells({1}))
        if (c.part == KvPart::V)
            v1.push_back(c);
    h = test(promptWithOff({1}), v1, engine, reference);
    QVERIFY2(h.front().kind == "channel_scale", kinds(h).c_str());
    QVERIFY(std::fabs(h.front().parameter("min") - 0.5) < 1e-6 && std::fabs(h.front().parameter("max") - 1.5) < 1e-6);
    // K (before RoPE) and V of head 2 plus a constant vector: fitted on the un-rotated K.
    const RopeSettings rope{10000.0, 0, true, 1.0, {}};
    engine = reference;
    double norm = 0;
    for (int i = 0; i < kDim; ++i)
        norm += 0.3 * (i % 3 - 1) * 0.3 * (i % 3 - 1);
    for (std::int64_t t = 0; t < kTokens; ++t) {
        double in[kDim], raw[kDim], out[kDim];
        float* k = engine.k.data() + engine.index(KvPart::K, 2, t);
        std::copy_n(k, kDim, in);
        applyRope(rope, kDim, double(t), true, in, raw);
        for (int i = 0; i < kDim; ++i)
            raw[i] += 0.3 * (i % 3 - 1);
        applyRope(rope, kDim, double(t), false, raw, out);
        for (int i = 0; i < kDim; ++i) {
            k[i] = float(out[i]);
            engine.v[engine.index(KvPart::V, 2, t) + std::size_t(i)] += float(0.3 * (i % 3 - 1));
        }
    }
    h = test(promptWithOff({2}), offCells({2}), engine, reference, rope);
    QVERIFY2(h.front().kind == "bias", kinds(h).c_str());
    QVERIFY(std::fabs(h.front().parameter("norm") - std::sqrt(norm)) < 1e-5);
    QVERIFY(h.front().residualFloors < 0.05);
    // Without the RoPE, K's bias is fitted as it is stored, which a rotated bias is not.
    for (const Hypothesis& x : test(promptWithOff({2}), offCells({2}), engine, reference))
        QVERIFY(x.kind != "bias");
    // K of every head clipped at +-0.75.
    engine = reference;
    for (float& x : engine.k)
        x = std::clamp(x, -0.75f, 0.75f);
    h = test(every, offCells({0, 1, 2, 3}, true), engine, reference);
    QVERIFY2(h.front().kind == "clipped", kinds(h).c_str());
    QCOMPARE(h.front().parameter("bound"), 0.75);
    QVERIFY(h.front().residualFloors < 0.01);
}

// A free fit never explains what it does not model: another draw, a head swap, a RoPE offset
// (without the RoPE settings, so that nothing exact explains it first), a factor per cell (no
// token shares one), a few tokens of stale data.
void TestHypotheses::freeFitsExplainNothingElse()
{
    const RopeSettings rope{10000.0, 0, true, 1.0, {}};
    const LayerKv reference = randomLayer(6);
    const std::vector<int> all = {0, 1, 2, 3};
    const PromptAnalysis every = promptWithOff(all);
    std::vector<LayerKv> faults;
    faults.push_back(randomLayer(77));
    LayerKv swapped = reference;
    for (std::int64_t t = 0; t < kTokens; ++t)
        for (auto* side : {&swapped.k, &swapped.v})
            std::swap_ranges(side->begin() + std::ptrdiff_t(swapped.index(KvPart::K, 0, t)),
                             side->begin() + std::ptrdiff_t(swapped.index(KvPart::K, 2, t)),
                             side->begin() + std::ptrdiff_t(swapped.index(KvPart::K, 2, t)));
    faults.push_back(swapped);
    faults.push_back(rotatedOtherwise(reference, rope, rope, 1));
    LayerKv perCell = reference;
    std::mt19937_64 rng(8);
    std::uniform_real_distribution<float> factor(0.4f, 1.6f);
    for (std::int64_t t = 0; t < kTokens; ++t)
        for (int h = 0; h < kHeads; ++h)
            for (KvPart part : {KvPart::K, KvPart::V}) {
                const float f = factor(rng);
                for (int i = 0; i < kDim; ++i)
                    perCell.values(part)[perCell.index(part, h, t) + std::size_t(i)] *= f;
            }
    faults.push_back(perCell);
    LayerKv stale = reference;
    const LayerKv other = randomLayer(78);
    for (std::int64_t t = 8; t < 16; ++t)
        for (KvPart part : {KvPart::K, KvPart::V})
            std::copy_n(other.values(part).begin() + std::ptrdiff_t(other.index(part, 0, t)), kHeads * kDim,
                        stale.values(part).begin() + std::ptrdiff_t(stale.index(part, 0, t)));
    faults.push_back(stale);
    std::vector<OffCell> staleCells;  // the stale tokens only
    for (const OffCell& c : offCells(all))
        if (c.token >= 8 && c.token < 16)
            staleCells.push_back(c);
    for (std::size_t i = 0; i < faults.size(); ++i)
        // The RoPE offset without the RoPE: no RoPE hypothesis explains it first.
        for (const Hypothesis& x : test(every, i + 1 == faults.size() ? staleCells : offCells(all), faults[i], reference,
                                        i == 2 ? std::nullopt : std::optional<RopeSettings>(rope)))
            QVERIFY2(x.kind != "token_scale" && x.kind != "channel_scale" && x.kind != "bias" && x.kind != "clipped",
                     qPrintable(QString("fault %1 explained by %2").arg(i).arg(QString::fromStdString(x.kind))));
}

QTEST_APPLESS_MAIN(TestHypotheses)
#include "tst_hypotheses.moc"
