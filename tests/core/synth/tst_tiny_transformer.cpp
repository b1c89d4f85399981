// The synthetic generator's small transformer (synth/tiny_transformer.h) against a
// double-precision forward written here from the published formulas (docs/synth.md):
// RMSNorm x / sqrt(mean(x^2) + 1e-6) * w; RoPE rotate-half (pairs (i, i + d/2)),
// inv_freq = 10000^(-2i/d), angle = pos * inv_freq; GQA attention (query head h reads KV head
// h / (query heads / KV heads)), scores q.k / sqrt(d), causal, the even layers within a sliding
// window of `window` positions counting the query token; gated SiLU MLP silu(x Wg) * (x Wu) Wd;
// residual adds; final RMSNorm and the LM head. Checked: the cache's K (after RoPE) and V of
// every layer and the logits, in the three numerics, prefill and decode a token at a time, and
// that the rope_offset fault rotates K by exactly one more position.
//
// The weights are private to the model: the test draws them itself from the same seeded
// normal stream, in the order the model's constructor documents (embed, final norm, LM head,
// then per layer attention norm, Wq, Wk with channels 1 and d/2 + 1 of each head six times
// larger, Wv, Wo, MLP norm, Wgate, Wup, Wdown). A wrong draw would miss every check by far,
// not by a rounding. The bf16 numerics' weights are rounded to bf16 here by this file's own
// round-to-nearest-even.

#include "synth/tiny_transformer.h"
#include "util/deterministic_math.h"

#include <QTest>

#include <bit>
#include <cmath>

using namespace kvscope;
using namespace kvscope::synth;

namespace {

constexpr std::uint64_t kSeed = 7;

ModelShape tinyShape()
{
    ModelShape s;
    s.layers = 2;
    s.hidden = 16;
    s.queryHeads = 4;
    s.kvHeads = 2;
    s.headDim = 8;
    s.ffn = 24;
    s.vocab = 20;
    s.window = 3;  // layer 0 slides over 3 positions; with 8 tokens the window matters
    return s;
}

// Round-to-nearest-even to bfloat16 (finite values), from the bits.
float bf16(float x)
{
    std::uint32_t bits = std::bit_cast<std::uint32_t>(x);
    bits += 0x7fffu + ((bits >> 16) & 1u);
    return std::bit_cast<float>(bits & 0xffff0000u);
}

using Vec = std::vector<double>;

struct RefLayer {
    Vec attnNorm, mlpNorm, wq, wk, wv, wo, wGate, wUp, wDown;  // matrices row-major [in, out]
};
struct RefWeights {
    Vec embed, finalNorm, lmHead;
    std::vector<RefLayer> layers;
};

RefWeights drawWeights(const ModelShape& s, std::uint64_t seed, bool roundBf16)
{
    detmath::NormalSampler normal(seed);
    const auto keep = [&](float x) { return double(roundBf16 ? bf16(x) : x); };
    const auto matrix = [&](int rows, int cols, double stddev) {
        std::vector<float> m(std::size_t(rows) * std::size_t(cols));
        for (float& x : m)
            x = float(normal() * stddev);
        return m;
    };
    const auto norm = [&](int size) {
        std::vector<float> w(static_cast<std::size_t>(size));
        for (float& x : w)
            x = float(1.0 + 0.1 * normal());
        return w;
    };
    const auto toVec = [&](const std::vector<float>& m) {
        Vec v;
        for (float x : m)
            v.push_back(keep(x));
        return v;
    };
    const int h = s.hidden, q = s.queryHeads * s.headDim, kv = s.kvHeads * s.headDim;
    RefWeights w;
    w.embed = toVec(matrix(s.vocab, h, 1.0));
    w.finalNorm = toVec(norm(h));
    w.lmHead = toVec(matrix(h, s.vocab, 2.0 / std::sqrt(double(h))));
    for (int l = 0; l < s.layers; ++l) {
        RefLayer L;
        L.attnNorm = toVec(norm(h));
        L.wq = toVec(matrix(h, q, 1.0 / std::sqrt(double(h))));
        std::vector<float> wk = matrix(h, kv, 1.0 / std::sqrt(double(h)));
        for (int head = 0; head < s.kvHeads; ++head)
            for (int c : {1, s.headDim / 2 + 1})
                for (int r = 0; r < h; ++r)
                    wk[std::size_t(r) * std::size_t(kv) + std::size_t(head * s.headDim + c)] *= 6.0f;
        L.wk = toVec(wk);
        L.wv = toVec(matrix(h, kv, 1.0 / std::sqrt(double(h))));
        L.wo = toVec(matrix(q, h, 0.5 / std::sqrt(double(q))));
        L.mlpNorm = toVec(norm(h));
        L.wGate = toVec(matrix(h, s.ffn, 1.0 / std::sqrt(double(h))));
        L.wUp = toVec(matrix(h, s.ffn, 1.0 / std::sqrt(double(h))));
        L.wDown = toVec(matrix(s.ffn, h, 0.5 / std::sqrt(double(s.ffn))));
        w.layers.push_back(std::move(L));
    }
    return w;
}

// x [n, in] times w [in, out].
Vec matmul(const Vec& x, int n, int in, const Vec& w, int out)
{
    Vec y(std::size_t(n) * std::size_t(out), 0.0);
    for (int i = 0; i < n; ++i)
        for (int k = 0; k < in; ++k)
            for (int j = 0; j < out; ++j)
                y[std::size_t(i) * std::size_t(out) + std::size_t(j)] +=
                    x[std::size_t(i) * std::size_t(in) + std::size_t(k)] * w[std::size_t(k) * std::size_t(out) + std::size_t(j)];
    return y;
}

Vec rmsNorm(const Vec& x, int n, int dim, const Vec& weight)
{
    Vec y(x.size());
    for (int i = 0; i < n; ++i) {
        double squares = 0;
        for (int c = 0; c < dim; ++c)
            squares += x[std::size_t(i * dim + c)] * x[std::size_t(i * dim + c)];
        const double inv = 1.0 / std::sqrt(squares / dim + 1e-6);
        for (int c = 0; c < dim; ++c)
            y[std::size_t(i * dim + c)] = x[std::size_t(i * dim + c)] * inv * weight[std::size_t(c)];
    }
    return y;
}

// Rotate-half RoPE of `heads` heads of `dim` values at `row`, for position `pos`.
void rope(double* row, int heads, int dim, double pos)
{
    const int half = dim / 2;
    for (int head = 0; head < heads; ++head)
        for (int i = 0; i < half; ++i) {
            const double angle = pos * std::pow(10000.0, -2.0 * i / dim);
            double* a = row + head * dim + i;
            double* b = a + half;
            const double x = *a, y = *b;
            *a = x * std::cos(angle) - y * std::sin(angle);
            *b = y * std::cos(angle) + x * std::sin(angle);
        }
}

struct RefRun {
    std::vector<Vec> k, v;  // [layer] [position, kv heads, head dim]
    Vec logits;             // [position, vocab]
};

// The whole sequence at positions 0.. (causal attention makes each position's outputs those of
// a prefill up to it). `ropeOffsetLayer`: K of that layer at positions >= promptLen rotated for
// position + 1 (the rope_offset fault, as docs/synth.md states it).
RefRun referenceForward(const ModelShape& s, const RefWeights& w, const std::vector<std::int64_t>& tokens,
                        int ropeOffsetLayer = -1, std::int64_t promptLen = 0)
{
    const int n = int(tokens.size()), h = s.hidden, hd = s.headDim, qw = s.queryHeads * hd, kvw = s.kvHeads * hd;
    Vec x(std::size_t(n) * std::size_t(h));
    for (int i = 0; i < n; ++i)
        for (int c = 0; c < h; ++c)
            x[std::size_t(i * h + c)] = w.embed[std::size_t(tokens[std::size_t(i)] * h + c)];
    RefRun run;
    for (int l = 0; l < s.layers; ++l) {
        const RefLayer& L = w.layers[std::size_t(l)];
        const Vec hn = rmsNorm(x, n, h, L.attnNorm);
        Vec q = matmul(hn, n, h, L.wq, qw), k = matmul(hn, n, h, L.wk, kvw);
        const Vec v = matmul(hn, n, h, L.wv, kvw);
        for (int i = 0; i < n; ++i) {
            rope(q.data() + i * qw, s.queryHeads, hd, i);
            const bool offset = l == ropeOffsetLayer && i >= promptLen;
            rope(k.data() + i * kvw, s.kvHeads, hd, i + (offset ? 1 : 0));
        }
        const bool sliding = l % 2 == 0;
        Vec attended(std::size_t(n) * std::size_t(qw), 0.0);
        for (int i = 0; i < n; ++i)
            for (int head = 0; head < s.queryHeads; ++head) {
                const int kvHead = head / (s.queryHeads / s.kvHeads);
                const int first = sliding ? std::max(0, i - s.window + 1) : 0;
                Vec scores;
                for (int j = first; j <= i; ++j) {
                    double dot = 0;
                    for (int d = 0; d < hd; ++d)
                        dot += q[std::size_t(i * qw + head * hd + d)] * k[std::size_t(j * kvw + kvHead * hd + d)];
                    scores.push_back(dot / std::sqrt(double(hd)));
                }
                const double top = *std::max_element(scores.begin(), scores.end());
                double sum = 0;
                for (double& sc : scores)
                    sum += (sc = std::exp(sc - top));
                for (int j = first; j <= i; ++j)
                    for (int d = 0; d < hd; ++d)
                        attended[std::size_t(i * qw + head * hd + d)] +=
                            scores[std::size_t(j - first)] / sum * v[std::size_t(j * kvw + kvHead * hd + d)];
            }
        const Vec o = matmul(attended, n, qw, L.wo, h);
        for (std::size_t i = 0; i < x.size(); ++i)
            x[i] += o[i];
        const Vec m = rmsNorm(x, n, h, L.mlpNorm);
        const Vec g = matmul(m, n, h, L.wGate, s.ffn), u = matmul(m, n, h, L.wUp, s.ffn);
        Vec act(g.size());
        for (std::size_t i = 0; i < g.size(); ++i)
            act[i] = g[i] / (1.0 + std::exp(-g[i])) * u[i];
        const Vec down = matmul(act, n, s.ffn, L.wDown, h);
        for (std::size_t i = 0; i < x.size(); ++i)
            x[i] += down[i];
        run.k.push_back(k);
        run.v.push_back(v);
    }
    run.logits = matmul(rmsNorm(x, n, h, w.finalNorm), n, h, w.lmHead, s.vocab);
    return run;
}

double maxAbs(const Vec& x)
{
    double m = 0;
    for (double v : x)
        m = std::max(m, std::abs(v));
    return m;
}

// The largest |got - want| over the tensor, as a fraction of the tensor's largest |want|.
double relativeError(const std::vector<float>& got, const Vec& want)
{
    if (got.size() != want.size())
        return INFINITY;
    double e = 0;
    for (std::size_t i = 0; i < got.size(); ++i)
        e = std::max(e, std::abs(double(got[i]) - want[i]));
    return e / maxAbs(want);
}

const std::vector<std::int64_t> kTokens{3, 17, 0, 9, 9, 12, 5, 19};  // 8 tokens of a vocabulary of 20
constexpr std::int64_t kPromptLen = 5;

// Tolerances, as a fraction of each tensor's largest magnitude.
// Baseline is fp32 throughout (unit roundoff u = 2^-24 = 6e-8): a path from the embedding to a
// logit goes through about 30 rounded steps in two layers (sums of at most 24 products in
// order, whose rounding errors mostly cancel; exp/sin/cos built within a few ulp,
// util/deterministic_math.h): 30 u = 2e-6 if they all added up (measured: 3e-7). That is below
// what a formula slip would cost (an RMSNorm epsilon of 1e-5 instead of 1e-6 moves values by
// ~5e-6; a shifted window or a wrong RoPE pairing by tens of percent).
constexpr double kFp32Tolerance = 2e-6;
// The bf16 numerics round every activation to bf16 (unit roundoff 2^-9 = 0.2%), about 15 times a
// layer (norm, projections, RoPE, scores, probabilities, attention output, residual, MLP), so
// two layers carry ~30 roundings: 30 x 2^-9 = 6% if they all added up, sqrt(30) x 2^-9 = 1%
// as independent roundings do; we allow half the worst case, 15 x 2^-9 = 3% (measured: 0.75%).
// K and V of layer 0 have three roundings before them (norm, projection, RoPE): 4 x 2^-9
// (measured: 0.43%).
constexpr double kBf16FirstLayerTolerance = 4.0 / 512;
constexpr double kBf16Tolerance = 15.0 / 512;

}  // namespace

class TestTinyTransformer : public QObject {
    Q_OBJECT

private slots:
    void referenceHandWorked();
    void baselineAgainstReference();
    void bf16NumericsAgainstReference_data();
    void bf16NumericsAgainstReference();
    void decodeATokenAtATimeIsThePrefill();
    void ropeOffsetRotatesKOneMorePosition();
};

void TestTinyTransformer::referenceHandWorked()
{
    // The test's RoPE: position 0 is the identity; for d = 4 pair (0, 2) turns by pos rad, pair
    // (1, 3) by pos / 100 (10000^(-2/4)); (1, 0) at position 1 -> (cos 1, sin 1).
    double x[4] = {1, 0, 0, 0};
    rope(x, 1, 4, 0);
    QCOMPARE(x[0], 1.0);
    QCOMPARE(x[2], 0.0);
    rope(x, 1, 4, 1);
    QVERIFY(std::abs(x[0] - std::cos(1.0)) < 1e-15 && std::abs(x[2] - std::sin(1.0)) < 1e-15);
    double y[4] = {0, 1, 0, 0};
    rope(y, 1, 4, 2);
    QVERIFY(std::abs(y[1] - std::cos(0.02)) < 1e-15 && std::abs(y[3] - std::sin(0.02)) < 1e-15);
    // RMSNorm of (3, 4) with weights (1, 2): rms = sqrt(12.5 + 1e-6).
    const Vec n = rmsNorm({3, 4}, 1, 2, {1, 2});
    QVERIFY(std::abs(n[0] - 3 / std::sqrt(12.5 + 1e-6)) < 1e-15 && std::abs(n[1] - 8 / std::sqrt(12.5 + 1e-6)) < 1e-15);
    // The test's bf16 rounding: ties to even.
    QCOMPARE(bf16(1.0f + 1.0f / 256), 1.0f);                  // halfway, down to even
    QCOMPARE(bf16(1.0f + 3.0f / 256), 1.0f + 4.0f / 256);     // halfway, up to even
    QCOMPARE(bf16(1.0f + 1.5f / 256), 1.0f + 2.0f / 256);     // above halfway
}

void TestTinyTransformer::baselineAgainstReference()
{
    const ModelShape shape = tinyShape();
    const TinyTransformer model(shape, kSeed);
    std::vector<LayerCache> cache;
    const Matrix logits = model.forward(kTokens, 0, cache, Numerics::Baseline);
    const RefRun ref = referenceForward(shape, drawWeights(shape, kSeed, false), kTokens);
    QCOMPARE(logits.rows, int(kTokens.size()));
    QCOMPARE(logits.cols, shape.vocab);
    QCOMPARE(int(cache.size()), shape.layers);
    for (int l = 0; l < shape.layers; ++l) {
        QCOMPARE(cache[std::size_t(l)].positions, std::int64_t(kTokens.size()));
        const double k = relativeError(cache[std::size_t(l)].k, ref.k[std::size_t(l)]);
        const double v = relativeError(cache[std::size_t(l)].v, ref.v[std::size_t(l)]);
        QVERIFY2(k < kFp32Tolerance, qPrintable(QString("layer %1 K off by %2").arg(l).arg(k)));
        QVERIFY2(v < kFp32Tolerance, qPrintable(QString("layer %1 V off by %2").arg(l).arg(v)));
    }
    const double e = relativeError(logits.values, ref.logits);
    QVERIFY2(e < kFp32Tolerance, qPrintable(QString("logits off by %1").arg(e)));

    // The formulas matter at this tolerance: the reference with the window ignored, or with
    // interleaved RoPE pairs, would be far off (a check that the reference is not too lax).
    ModelShape full = shape;
    full.window = 1000;
    const RefRun noWindow = referenceForward(full, drawWeights(shape, kSeed, false), kTokens);
    QVERIFY(relativeError(logits.values, noWindow.logits) > 100 * kFp32Tolerance);
    QVERIFY(relativeError(cache[1].k, noWindow.k[1]) > 100 * kFp32Tolerance);  // layer 1's input differs
}

void TestTinyTransformer::bf16NumericsAgainstReference_data()
{
    QTest::addColumn<int>("numerics");
    QTest::newRow("expected (HF)") << int(Numerics::Expected);
    QTest::newRow("engine (fused)") << int(Numerics::Engine);
}

void TestTinyTransformer::bf16NumericsAgainstReference()
{
    QFETCH(int, numerics);
    const ModelShape shape = tinyShape();
    const TinyTransformer model(shape, kSeed);
    std::vector<LayerCache> cache;
    const Matrix logits = model.forward(kTokens, 0, cache, Numerics(numerics));
    // Against the exact forward of the bf16-rounded weights: what is left is activation rounding.
    const RefRun ref = referenceForward(shape, drawWeights(shape, kSeed, true), kTokens);
    for (int l = 0; l < shape.layers; ++l) {
        const double tolerance = l == 0 ? kBf16FirstLayerTolerance : kBf16Tolerance;
        const double k = relativeError(cache[std::size_t(l)].k, ref.k[std::size_t(l)]);
        const double v = relativeError(cache[std::size_t(l)].v, ref.v[std::size_t(l)]);
        QVERIFY2(k < tolerance, qPrintable(QString("layer %1 K off by %2").arg(l).arg(k)));
        QVERIFY2(v < tolerance, qPrintable(QString("layer %1 V off by %2").arg(l).arg(v)));
        // Stored as bf16: every value of the cache is a bf16 value.
        for (float x : cache[std::size_t(l)].k)
            QCOMPARE(bf16(x), x);
        for (float x : cache[std::size_t(l)].v)
            QCOMPARE(bf16(x), x);
    }
    const double e = relativeError(logits.values, ref.logits);
    QVERIFY2(e < kBf16Tolerance, qPrintable(QString("logits off by %1").arg(e)));
    for (float x : logits.values)
        QCOMPARE(bf16(x), x);
}

void TestTinyTransformer::decodeATokenAtATimeIsThePrefill()
{
    // Prefill of kPromptLen tokens, then a token at a time after the cache: each step's logits
    // are the reference's at that position, and the cache ends as a prefill of them all.
    const ModelShape shape = tinyShape();
    const TinyTransformer model(shape, kSeed);
    const RefRun ref = referenceForward(shape, drawWeights(shape, kSeed, false), kTokens);
    std::vector<LayerCache> whole, stepped;
    model.forward(kTokens, 0, whole, Numerics::Baseline);
    const std::vector<std::int64_t> prompt(kTokens.begin(), kTokens.begin() + kPromptLen);
    model.forward(prompt, 0, stepped, Numerics::Baseline);
    for (std::int64_t pos = kPromptLen; pos < std::int64_t(kTokens.size()); ++pos) {
        const Matrix step = model.forward({kTokens[std::size_t(pos)]}, pos, stepped, Numerics::Baseline);
        QCOMPARE(step.rows, 1);
        const Vec want(ref.logits.begin() + pos * shape.vocab, ref.logits.begin() + (pos + 1) * shape.vocab);
        QVERIFY(relativeError(step.values, want) < kFp32Tolerance);
    }
    for (int l = 0; l < shape.layers; ++l) {
        QCOMPARE(stepped[std::size_t(l)].positions, whole[std::size_t(l)].positions);
        QVERIFY(relativeError(stepped[std::size_t(l)].k, ref.k[std::size_t(l)]) < kFp32Tolerance);
        QVERIFY(relativeError(stepped[std::size_t(l)].v, ref.v[std::size_t(l)]) < kFp32Tolerance);
    }
}

void TestTinyTransformer::ropeOffsetRotatesKOneMorePosition()
{
    // The rope_offset fault in layer 1: K of positions >= promptLen rotated for position + 1.
    // Since R(pos + 1) = R(1) R(pos), the faulty K is the clean K turned by inv_freq_i more in
    // each pair (i, i + d/2); the engine rounds each to bf16 once, so the two sides differ from
    // the exact turn by at most half a bf16 ulp of each (2^-9 relative): within 2 x 2^-8 of the
    // pair's length. Everything before (layer 0, layer 1's V, the prefill's K) is the same bits.
    const ModelShape shape = tinyShape();
    const TinyTransformer model(shape, kSeed);
    std::vector<LayerCache> clean, faulty;
    model.forward(kTokens, 0, clean, Numerics::Engine, {}, kPromptLen);
    EngineFaults faults;
    faults.ropeOffsetLayer = 1;
    model.forward(kTokens, 0, faulty, Numerics::Engine, faults, kPromptLen);
    QCOMPARE(faulty[0].k, clean[0].k);
    QCOMPARE(faulty[0].v, clean[0].v);
    QCOMPARE(faulty[1].v, clean[1].v);
    const int hd = shape.headDim, half = hd / 2, row = shape.kvHeads * hd;
    bool changed = false;
    for (std::int64_t pos = 0; pos < std::int64_t(kTokens.size()); ++pos)
        for (int head = 0; head < shape.kvHeads; ++head)
            for (int i = 0; i < half; ++i) {
                const std::size_t lo = std::size_t(pos * row + head * hd + i), hi = lo + std::size_t(half);
                const double a = clean[1].k[lo], b = clean[1].k[hi];
                if (pos < kPromptLen) {
                    QCOMPARE(faulty[1].k[lo], clean[1].k[lo]);
                    QCOMPARE(faulty[1].k[hi], clean[1].k[hi]);
                    continue;
                }
                const double angle = std::pow(10000.0, -2.0 * i / hd);  // one position
                const double wantLo = a * std::cos(angle) - b * std::sin(angle);
                const double wantHi = b * std::cos(angle) + a * std::sin(angle);
                const double tolerance = 2.0 / 256 * std::hypot(a, b) + 1e-30;
                QVERIFY2(std::abs(faulty[1].k[lo] - wantLo) <= tolerance && std::abs(faulty[1].k[hi] - wantHi) <= tolerance,
                         qPrintable(QString("pos %1 head %2 pair %3").arg(pos).arg(head).arg(i)));
                changed = changed || faulty[1].k[lo] != clean[1].k[lo];
            }
    QVERIFY(changed);
    // And against the reference with the offset: the faulty K as the formula has it.
    const RefRun ref = referenceForward(shape, drawWeights(shape, kSeed, true), kTokens, 1, kPromptLen);
    QVERIFY(relativeError(faulty[1].k, ref.k[1]) < kBf16Tolerance);
    const RefRun cleanRef = referenceForward(shape, drawWeights(shape, kSeed, true), kTokens);
    QVERIFY(relativeError(faulty[1].k, cleanRef.k[1]) > relativeError(faulty[1].k, ref.k[1]));
}

QTEST_APPLESS_MAIN(TestTinyTransformer)
#include "tst_tiny_transformer.moc"
