// The synthetic generator's impact (synth/impact_capture.h, docs/bundle-format.md "Impact").
//
// The main check is against a computation written here: the same small decoder in double
// precision, from the fp32 master weights (TinyTransformer::masterWeights) and the formulas of
// docs/synth.md (RMSNorm x / sqrt(mean(x^2) + 1e-6) * w; rotate-half RoPE, pairs (i, i + d/2),
// inv_freq = 10000^(-2i/d) rounded to fp32 as HF computes it; GQA attention, query head h
// reading KV head h / (query heads / KV heads), scores q.k / sqrt(d), the even layers within a
// sliding window of `window` positions counting the query token; gated SiLU MLP
// silu(x Wg) * (x Wu) Wd; residual adds; final RMSNorm; LM head), with the per-step transplant
// of docs/bundle-format.md: a step at position q reads, in a replaced layer, positions [0, q] of
// the engine's cache (as the bundle holds it), and in every other layer its past [0, q) from the
// reference's own cache and its own K and V as computed. Fed the engine's KV of a capture with
// a head swap, its KL per step must agree with the record's, and a clean layer's must be noise.
//
// Also: decodeSteps reproduces forward's logits bit for bit (GQA, MLA, hybrid), so that a
// self-transplant is exactly 0; klDivergence against hand-worked and double computations; and
// the clean captures' impact at the noise level documented in docs/synth.md ("Impact").

#include "format/bundle_reader.h"
#include "kv/capture_loader.h"
#include "synth/impact_capture.h"
#include "synth/model_capture.h"
#include "synth/tiny_transformer.h"

#include <QTemporaryDir>
#include <QTest>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>

using namespace kvscope;
using namespace kvscope::synth;

namespace {

using Vec = std::vector<double>;

int layerIndex(const std::string& name)
{
    return std::stoi(name.substr(std::string("model.layers.").size()));
}

bool sameBits(const Matrix& a, const float* b, int rows)
{
    return std::memcmp(a.values.data(), b, std::size_t(rows) * std::size_t(a.cols) * sizeof(float)) == 0;
}

// KL(P || Q) of the softmax distributions of two logit rows, in long double.
double klReference(const Vec& p, const Vec& q)
{
    const auto logSoftmax = [](const Vec& x) {
        const long double top = *std::max_element(x.begin(), x.end());
        long double sum = 0;
        for (double v : x)
            sum += std::exp((long double)v - top);
        std::vector<long double> out;
        for (double v : x)
            out.push_back((long double)v - top - std::log(sum));
        return out;
    };
    const std::vector<long double> lp = logSoftmax(p), lq = logSoftmax(q);
    long double kl = 0;
    for (std::size_t i = 0; i < p.size(); ++i)
        kl += std::exp(lp[i]) * (lp[i] - lq[i]);
    return double(kl);
}

Vec toVec(const float* x, int n)
{
    return Vec(x, x + n);
}

int argmax(const Vec& x)
{
    return int(std::max_element(x.begin(), x.end()) - x.begin());
}

// The distance between the largest logit and the second.
double topTwoMargin(Vec x)
{
    std::partial_sort(x.begin(), x.begin() + 2, x.end(), std::greater<>());
    return x[0] - x[1];
}

// One layer's K (after RoPE) and V, [positions, KV heads * head dim].
struct DoubleKv {
    Vec k, v;
};

// The decoder of docs/synth.md in double precision (GQA layers only: no MLA, no Mamba2).
class DoubleModel {
public:
    explicit DoubleModel(const TinyTransformer& model)
        : m_s(model.shape())
        , m_w(model.masterWeights())
    {
        for (int i = 0; i < m_s.headDim / 2; ++i)
            m_invFreq.push_back(double(float(std::pow(10000.0, -2.0 * i / m_s.headDim))));
    }

    int width() const { return m_s.kvHeads * m_s.headDim; }

    // The token at position q through every layer: layer l reads `replaced[l]`'s positions
    // [0, q] when given, else `past[l]`'s [0, q) and the row's own K and V (appended to `own`
    // when given). Returns the logits.
    Vec step(std::int64_t token, std::int64_t q, const std::vector<DoubleKv>& past,
             const std::vector<const DoubleKv*>& replaced, std::vector<DoubleKv>* own = nullptr) const
    {
        const ModelShape& s = m_s;
        const int hd = s.headDim, kvw = width(), group = s.queryHeads / s.kvHeads;
        Vec x = toVec(m_w.embed.row(int(token)), s.hidden);
        for (int l = 0; l < s.layers; ++l) {
            const TinyTransformer::Layer& L = m_w.layers[std::size_t(l)];
            const Vec h = norm(x, L.attnNorm);
            Vec query = linear(h, L.wq), key = linear(h, L.wk);
            const Vec value = linear(h, L.wv);
            rope(query.data(), s.queryHeads, double(q));
            rope(key.data(), s.kvHeads, double(q));
            if (own) {
                (*own)[std::size_t(l)].k.insert((*own)[std::size_t(l)].k.end(), key.begin(), key.end());
                (*own)[std::size_t(l)].v.insert((*own)[std::size_t(l)].v.end(), value.begin(), value.end());
            }
            const DoubleKv* whole = replaced[std::size_t(l)];
            const auto kAt = [&](std::int64_t j) {
                return whole ? &whole->k[std::size_t(j * kvw)] : j < q ? &past[std::size_t(l)].k[std::size_t(j * kvw)] : key.data();
            };
            const auto vAt = [&](std::int64_t j) {
                return whole ? &whole->v[std::size_t(j * kvw)] : j < q ? &past[std::size_t(l)].v[std::size_t(j * kvw)] : value.data();
            };
            // Sliding on the even layers, counting the query token.
            const std::int64_t first = l % 2 == 0 ? std::max<std::int64_t>(0, q - s.window + 1) : 0;
            Vec attended(std::size_t(s.queryHeads * hd), 0.0);
            for (int head = 0; head < s.queryHeads; ++head) {
                const int kvHead = head / group;
                Vec scores;
                for (std::int64_t j = first; j <= q; ++j) {
                    double dot = 0;
                    for (int d = 0; d < hd; ++d)
                        dot += query[std::size_t(head * hd + d)] * kAt(j)[kvHead * hd + d];
                    scores.push_back(dot / std::sqrt(double(hd)));
                }
                const double top = *std::max_element(scores.begin(), scores.end());
                double sum = 0;
                for (double& sc : scores)
                    sum += (sc = std::exp(sc - top));
                for (std::int64_t j = first; j <= q; ++j)
                    for (int d = 0; d < hd; ++d)
                        attended[std::size_t(head * hd + d)] += scores[std::size_t(j - first)] / sum * vAt(j)[kvHead * hd + d];
            }
            add(x, linear(attended, L.wo));
            const Vec m = norm(x, L.mlpNorm);
            const Vec gate = linear(m, L.wGate);
            Vec act = linear(m, L.wUp);
            for (std::size_t i = 0; i < act.size(); ++i)
                act[i] *= gate[i] / (1.0 + std::exp(-gate[i]));
            add(x, linear(act, L.wDown));
        }
        return linear(norm(x, m_w.finalNorm), m_w.lmHead);
    }

    // The reference's own run over `tokens`: its caches, and the logits of every position.
    std::vector<DoubleKv> reference(const std::vector<std::int64_t>& tokens, std::vector<Vec>& logits) const
    {
        std::vector<DoubleKv> cache(std::size_t(m_s.layers));
        const std::vector<const DoubleKv*> none(std::size_t(m_s.layers), nullptr);
        for (std::size_t p = 0; p < tokens.size(); ++p)
            logits.push_back(step(tokens[p], std::int64_t(p), cache, none, &cache));
        return cache;
    }

private:
    // x [in] times w [in, out].
    static Vec linear(const Vec& x, const Matrix& w)
    {
        Vec y(std::size_t(w.cols), 0.0);
        for (int k = 0; k < w.rows; ++k)
            for (int j = 0; j < w.cols; ++j)
                y[std::size_t(j)] += x[std::size_t(k)] * double(w.row(k)[j]);
        return y;
    }
    static Vec norm(const Vec& x, const std::vector<float>& weight)
    {
        double squares = 0;
        for (double v : x)
            squares += v * v;
        const double inv = 1.0 / std::sqrt(squares / double(x.size()) + 1e-6);
        Vec y(x.size());
        for (std::size_t c = 0; c < x.size(); ++c)
            y[c] = x[c] * inv * double(weight[c]);
        return y;
    }
    static void add(Vec& x, const Vec& y)
    {
        for (std::size_t i = 0; i < x.size(); ++i)
            x[i] += y[i];
    }
    void rope(double* x, int heads, double pos) const
    {
        const int half = m_s.headDim / 2;
        for (int head = 0; head < heads; ++head)
            for (int i = 0; i < half; ++i) {
                const double angle = pos * m_invFreq[std::size_t(i)];
                double* a = x + head * m_s.headDim + i;
                double* b = a + half;
                const double lo = *a, hi = *b;
                *a = lo * std::cos(angle) - hi * std::sin(angle);
                *b = hi * std::cos(angle) + lo * std::sin(angle);
            }
    }

    const ModelShape& m_s;
    const TinyTransformer::Weights& m_w;
    std::vector<double> m_invFreq;
};

// A layer's cache as the bundle holds the engine's: its positions, the reference's own where
// the engine holds none.
DoubleKv engineKv(const LayerKv& kv, const DoubleKv& own, int width)
{
    DoubleKv out = own;
    for (std::int64_t p = 0; p < kv.seq && std::size_t(p * width) < own.k.size(); ++p)
        if (kv.present[std::size_t(p)])
            for (int i = 0; i < width; ++i) {
                out.k[std::size_t(p * width + i)] = kv.k.data()[kv.index(KvPart::K, 0, p) + std::size_t(i)];
                out.v[std::size_t(p * width + i)] = kv.v.data()[kv.index(KvPart::V, 0, p) + std::size_t(i)];
            }
    return out;
}

// The decoder the capture tests use: 4 layers (sliding 0 and 2, full 1 and 3), default sizes.
ModelCaptureOptions smallCapture(std::uint64_t seed)
{
    ModelCaptureOptions o;
    o.seed = seed;
    o.impactSchemes = {};  // the schemes' rows are not what these tests read
    o.threads = 1;
    return o;
}

// A larger one: 6 layers, 4 KV heads of 32 (8 query heads), hidden 128, longer prompts.
ModelCaptureOptions largerCapture(std::uint64_t seed)
{
    ModelCaptureOptions o = smallCapture(seed);
    o.shape.layers = 6;
    o.shape.hidden = 128;
    o.shape.queryHeads = 8;
    o.shape.kvHeads = 4;
    o.shape.headDim = 32;
    o.shape.ffn = 256;
    o.shape.vocab = 512;
    o.shape.window = 24;
    o.promptLens = {28, 44};
    o.decodeTokens = 16;
    return o;
}

// The largest KL over the steps of a row.
double maxKl(const ImpactRecord& r, std::size_t t)
{
    double m = 0;
    for (std::int64_t g = 0; g < r.steps; ++g)
        m = std::max(m, r.klAt(t, g));
    return m;
}

// Noise: a clean engine's KV in one layer, or from one layer on, moves the synth's decoder's
// next-token distribution by at most this KL (docs/synth.md "Impact": the largest measured by
// cleanImpactIsNoise over three seeds of the default model and a larger one is 8.4e-4 nats, its
// fp32 baseline's rows 1.2e-3), and at most kNoiseFactor times what the fp32 baseline's KV does in
// the same row (measured: 2.1 times at most).
constexpr double kCleanKlBound = 2e-3;
constexpr double kNoiseFactor = 4.0;
// The record is computed by the bf16 ("expected") model, the test's by the double one: each
// step's logits differ by bf16 rounding (unit roundoff 2^-9, on logits of a few units; measured
// against the bundle's expected logits: up to 0.13). Where a fault moves the distribution well
// above noise (10 times kCleanKlBound), the logits' shift is computed to a few percent, and the
// KL, growing as its square, to twice that (measured: 5.3% at most over 144 steps of 0.1-0.9
// nats); 15% leaves room for another seed. Below that, both must be under kLargeKl.
constexpr double kLargeKl = 10 * kCleanKlBound;
constexpr double kRelativeTolerance = 0.15;
// top1_changed is compared where both distributions' two best logits are further apart than
// the two runs' logits can differ (asserted: at least 3 times the measured difference).
constexpr double kClearMargin = 0.5;

}  // namespace

class TestImpactCapture : public QObject {
    Q_OBJECT

private slots:
    void initTestCase() { QVERIFY(m_dir.isValid()); }
    void decodeStepsIsForward_data();
    void decodeStepsIsForward();
    void klHandWorked();
    void klAgainstDouble();
    void faultAgainstDoubleForward();
    void cleanImpactIsNoise();

private:
    QTemporaryDir m_dir;
};

void TestImpactCapture::decodeStepsIsForward_data()
{
    QTest::addColumn<QString>("model");
    QTest::addColumn<int>("numerics");
    for (const char* model : {"gqa", "mla", "hybrid"})
        for (const auto& [name, n] : {std::pair("baseline", Numerics::Baseline), std::pair("expected", Numerics::Expected),
                                      std::pair("engine", Numerics::Engine)})
            QTest::addRow("%s %s", model, name) << QString(model) << int(n);
}

void TestImpactCapture::decodeStepsIsForward()
{
    QFETCH(QString, model);
    QFETCH(int, numerics);
    const Numerics n = Numerics(numerics);
    ModelCaptureOptions o;
    o.shape.window = 5;  // the sliding layers' window matters over 17 tokens
    if (model == "mla")
        o = withMla(o);
    if (model == "hybrid") {
        o.shape.mambaLayers = {0, 2};
        o.shape.mambaCheckpointEvery = 4;
    }
    const ModelShape& s = o.shape;
    const TinyTransformer tiny(s, 11);
    std::vector<std::int64_t> tokens;
    std::mt19937 rng(5);
    for (int i = 0; i < 17; ++i)
        tokens.push_back(std::int64_t(rng() % std::uint32_t(s.vocab)));
    std::vector<LayerCache> cache;
    std::vector<Matrix> residuals;
    const Matrix logits = tiny.forward(tokens, 0, cache, n, {}, 0, &residuals);
    const int first = 6, rows = int(tokens.size()) - first;
    const auto rowsOf = [&](const Matrix& x) {
        Matrix m(rows, x.cols);
        std::copy_n(x.row(first), m.values.size(), m.values.begin());
        return m;
    };
    std::vector<TinyTransformer::PastRead> own;
    for (const LayerCache& c : cache)
        own.push_back({&c, false});
    // From the first layer, and from a later one on its residual stream.
    for (int from : {0, 1, 3}) {
        const Matrix steps = tiny.decodeSteps(rowsOf(residuals[std::size_t(from)]), first, from, own, n);
        QCOMPARE(steps.rows, rows);
        QCOMPARE(steps.cols, s.vocab);
        QVERIFY2(sameBits(steps, logits.row(first), rows), qPrintable(QString("from layer %1").arg(from)));
    }
    // A self-transplant, each attention layer alone and all of them: the layer reading every
    // position [0, q] of a cache made by cacheOf from its own K and V, as addImpact makes the
    // engine's; KL exactly 0.
    std::vector<LayerCache> copies(std::size_t(s.layers));
    std::vector<int> attention;
    for (int l = 0; l < s.layers; ++l) {
        if (s.isMamba(l))
            continue;
        attention.push_back(l);
        const LayerCache& c = cache[std::size_t(l)];
        const int kw = int(c.k.size() / tokens.size()), vw = int(c.v.size() / tokens.size());
        Matrix k(int(tokens.size()), kw), v(int(tokens.size()), vw);
        std::copy(c.k.begin(), c.k.end(), k.values.begin());
        std::copy(c.v.begin(), c.v.end(), v.values.begin());
        copies[std::size_t(l)] = tiny.cacheOf(l, k, v, n);
    }
    QCOMPARE(int(attention.size()), model == "hybrid" ? 2 : 4);
    for (int chosen = -1; chosen < int(attention.size()); ++chosen) {  // -1: every attention layer
        std::vector<TinyTransformer::PastRead> reads = own;
        for (int i = 0; i < int(attention.size()); ++i)
            if (chosen < 0 || i == chosen)
                reads[std::size_t(attention[std::size_t(i)])] = {&copies[std::size_t(attention[std::size_t(i)])], true};
        const Matrix steps = tiny.decodeSteps(rowsOf(residuals[0]), first, 0, reads, n);
        QVERIFY2(sameBits(steps, logits.row(first), rows), qPrintable(QString("self-transplant %1").arg(chosen)));
        for (int g = 0; g < rows; ++g)
            QCOMPARE(klDivergence(logits.row(first + g), steps.row(g), s.vocab), 0.0);
    }
    // And the check can fail: another layer's cache in its place moves the logits.
    std::vector<TinyTransformer::PastRead> wrong = own;
    const int a = attention[0], b = attention[1];
    wrong[std::size_t(b)] = {&copies[std::size_t(a)], true};
    const Matrix moved = tiny.decodeSteps(rowsOf(residuals[0]), first, 0, wrong, n);
    QVERIFY(!sameBits(moved, logits.row(first), rows));
    QVERIFY(klDivergence(logits.row(first), moved.row(0), s.vocab) > 0);
}

void TestImpactCapture::klHandWorked()
{
    // P = (1/2, 1/2), Q = (3/4, 1/4) (logits ln 3, 0): KL = 1/2 ln(2/3) + 1/2 ln 2 = 1/2 ln(4/3).
    const float uniform[2] = {0.0f, 0.0f}, skewed[2] = {float(std::log(3.0)), 0.0f};
    QVERIFY(std::abs(klDivergence(uniform, skewed, 2) - 0.5 * std::log(4.0 / 3.0)) < 1e-7);
    // The other way: 3/4 ln(3/2) + 1/4 ln(1/2).
    QVERIFY(std::abs(klDivergence(skewed, uniform, 2) - (0.75 * std::log(1.5) + 0.25 * std::log(0.5))) < 1e-7);
    // Identical logits: exactly 0; logits shifted by a constant are the same distribution.
    const float row[4] = {1.5f, -2.0f, 0.25f, 7.0f}, shifted[4] = {11.5f, 8.0f, 10.25f, 17.0f};
    QCOMPARE(klDivergence(row, row, 4), 0.0);
    QVERIFY(klDivergence(row, shifted, 4) < 1e-15);
    // Very different: P puts 1 - e^-100 on token 0, Q e^-100 there: KL = (1 - e^-100) 100 + e^-100 (-100) ~ 100.
    const float p[2] = {0.0f, -100.0f}, q[2] = {-100.0f, 0.0f};
    QVERIFY(std::abs(klDivergence(p, q, 2) - 100.0) < 1e-9);
    // Q all but 0 where P has mass: large, finite.
    const float sure[3] = {0.0f, 0.0f, -1000.0f}, other[3] = {-1000.0f, 0.0f, 0.0f};
    const double far = klDivergence(sure, other, 3);
    QVERIFY(std::isfinite(far) && std::abs(far - (0.5 * 1000 + 0.5 * std::log(0.5 / 0.5))) < 1e-6);
}

void TestImpactCapture::klAgainstDouble()
{
    // Rows spread like the model's logits (a few units), near each other and far apart.
    std::mt19937 rng(3);
    std::normal_distribution<float> normal(0.0f, 3.0f);
    for (int trial = 0; trial < 200; ++trial) {
        const int vocab = 1 + trial % 300;
        const float spread = trial % 3 == 0 ? 1e-3f : trial % 3 == 1 ? 0.1f : 5.0f;
        const std::size_t size = std::size_t(vocab);
        std::vector<float> p(size), q(size);
        for (int i = 0; i < vocab; ++i) {
            p[std::size_t(i)] = normal(rng);
            q[std::size_t(i)] = p[std::size_t(i)] + spread * normal(rng);
        }
        const double got = klDivergence(p.data(), q.data(), vocab);
        const double want = klReference(Vec(p.begin(), p.end()), Vec(q.begin(), q.end()));
        QVERIFY2(got >= 0 && std::isfinite(got), qPrintable(QString::number(got)));
        // Double sums of `vocab` terms: relative 1e-12 of the largest term, or of the sum.
        QVERIFY2(std::abs(got - want) <= 1e-12 * std::max(1.0, want) + 1e-13,
                 qPrintable(QString("vocab %1: %2 against %3").arg(vocab).arg(got).arg(want)));
    }
}

void TestImpactCapture::faultAgainstDoubleForward()
{
    // Layer 1's two KV heads exchanged in the engine's cache (a cache-side fault: the other
    // layers' KV are the clean engine's); 3 prompts of 16 decode steps.
    ModelCaptureOptions o = smallCapture(1);
    o.fault = FaultKind::HeadSwap;
    o.faultLayer = 1;
    o.promptLens = {12, 20, 28};
    o.decodeTokens = 16;
    const std::string path = m_dir.filePath("head_swap.h5").toStdString();
    writeModelCapture(path, o);
    const TinyTransformer tiny(o.shape, o.seed);
    const DoubleModel model(tiny);
    const auto reader = std::make_shared<BundleReader>(path);
    const CaptureLoader loader(reader);
    const std::vector<std::string> layers = reader->config().layerNames();
    QCOMPARE(int(layers.size()), 4);

    int large = 0, small = 0, checkedTop1 = 0, changedTop1 = 0;
    double worstRelative = 0, worstClean = 0, logitNoise = 0;
    double smallestLarge = INFINITY, largest = 0;
    for (const PromptInfo& p : reader->prompts()) {
        std::vector<std::int64_t> tokens = p.inputIds;
        tokens.insert(tokens.end(), p.teacherTokens.begin(), p.teacherTokens.end() - 1);
        const std::int64_t first = p.promptLen - 1;
        const int steps = int(p.teacherTokens.size());
        std::vector<Vec> ownLogits;
        const std::vector<DoubleKv> own = model.reference(tokens, ownLogits);
        std::vector<DoubleKv> engine;
        for (const std::string& name : layers) {
            const LayerKv kv = loader.engineLayer(p.id, name);
            QCOMPARE(int(kv.rowSize(KvPart::K)), model.width());
            QCOMPARE(int(kv.rowSize(KvPart::V)), model.width());
            engine.push_back(engineKv(kv, own[std::size_t(layerIndex(name))], model.width()));
        }
        const Logits expected = reader->readLogits(p.id, LogitsRole::Expected);
        QCOMPARE(expected.steps, std::int64_t(steps));
        for (int g = 0; g < steps; ++g)
            for (int i = 0; i < tiny.shape().vocab; ++i)
                logitNoise = std::max(logitNoise, std::abs(double(expected.values[std::size_t(g * expected.vocab + i)]) -
                                                           ownLogits[std::size_t(first + g)][std::size_t(i)]));
        const std::optional<ImpactRecord> record = reader->readImpact(p.id);
        QVERIFY(record.has_value());
        QCOMPARE(record->steps, std::int64_t(steps));
        QCOMPARE(record->computedBy, std::string("kvscope synth"));
        for (const std::string& name : layers)
            for (TransplantKind kind : {TransplantKind::Layer, TransplantKind::From}) {
                const int l = layerIndex(name);
                const std::optional<std::size_t> t = record->find({kind, name, {}});
                QVERIFY(t.has_value());
                std::vector<const DoubleKv*> replaced(layers.size(), nullptr);
                for (int r = l; r < int(layers.size()); ++r)
                    if (r == l || kind == TransplantKind::From)
                        replaced[std::size_t(r)] = &engine[std::size_t(r)];
                const bool faulty = l == 1 || (kind == TransplantKind::From && l < 1);
                for (int g = 0; g < steps; ++g) {
                    const std::int64_t q = first + g;
                    const Vec& reference = ownLogits[std::size_t(q)];
                    const Vec logits = model.step(tokens[std::size_t(q)], q, own, replaced);
                    const double want = klReference(reference, logits), got = record->klAt(*t, g);
                    const QString where = QString("%1 %2 %3 step %4: record %5, double %6")
                                              .arg(QString::fromStdString(p.id), kind == TransplantKind::Layer ? "layer" : "from",
                                                   QString::fromStdString(name)).arg(g).arg(got).arg(want);
                    if (!faulty) {
                        worstClean = std::max({worstClean, got, want});
                        QVERIFY2(got < kCleanKlBound && want < kCleanKlBound, qPrintable(where));
                    } else if (want > kLargeKl) {
                        ++large;
                        smallestLarge = std::min(smallestLarge, want);
                        largest = std::max(largest, want);
                        worstRelative = std::max(worstRelative, std::abs(got - want) / want);
                        QVERIFY2(std::abs(got - want) <= kRelativeTolerance * want, qPrintable(where));
                    } else {
                        ++small;
                        QVERIFY2(got < kLargeKl && want < kLargeKl, qPrintable(where));
                    }
                    if (std::min(topTwoMargin(reference), topTwoMargin(logits)) > kClearMargin) {
                        ++checkedTop1;
                        const bool changed = argmax(reference) != argmax(logits);
                        changedTop1 += changed;
                        QVERIFY2(record->changedAt(*t, g) == changed, qPrintable(where + " top-1"));
                    }
                }
            }
    }
    qInfo("head_swap in layer 1: %d steps of KL %.2g-%.2g nats agree within %.1f%% (worst), %d below %g; clean rows up to %.2g nats; top-1 checked at %d steps, changed at %d; the bf16 logits differ from "
          "the double ones by up to %.3g",
          large, smallestLarge, largest, 100 * worstRelative, small, kLargeKl, worstClean, checkedTop1, changedTop1, logitNoise);
    QVERIFY(kClearMargin >= 3 * logitNoise);
    // The comparison says something: the fault moves the output well above noise at many steps
    // and changes the next token at some.
    QVERIFY(large >= 100);
    QVERIFY(changedTop1 >= 5);
}

void TestImpactCapture::cleanImpactIsNoise()
{
    struct Case {
        const char* name;
        ModelCaptureOptions options;
    };
    const std::vector<Case> cases{{"default seed 1", smallCapture(1)}, {"default seed 2", smallCapture(2)},
                                  {"default seed 3", smallCapture(3)}, {"larger seed 1", largerCapture(1)}};
    double worstEngine = 0, worstBaseline = 0, worstRatio = 0;
    for (const Case& c : cases) {
        const std::string path = m_dir.filePath("clean.h5").toStdString();
        writeModelCapture(path, c.options);
        const BundleReader reader(path);
        double caseEngine = 0, caseBaseline = 0;
        for (const PromptInfo& p : reader.prompts()) {
            const std::optional<ImpactRecord> record = reader.readImpact(p.id);
            QVERIFY(record.has_value());
            for (const std::string& name : reader.config().layerNames())
                for (const auto& [engine, baseline] : {std::pair(TransplantKind::Layer, TransplantKind::Baseline),
                                                       std::pair(TransplantKind::From, TransplantKind::BaselineFrom)}) {
                    const std::optional<std::size_t> e = record->find({engine, name, {}}), b = record->find({baseline, name, {}});
                    QVERIFY(e && b);
                    const double engineMax = maxKl(*record, *e), baselineMax = maxKl(*record, *b);
                    const QString where = QString("%1 %2 %3 %4: max KL %5, baseline's %6")
                                              .arg(c.name, QString::fromStdString(p.id), QString::fromStdString(name),
                                                   engine == TransplantKind::Layer ? "layer" : "from")
                                              .arg(engineMax).arg(baselineMax);
                    caseEngine = std::max(caseEngine, engineMax);
                    caseBaseline = std::max(caseBaseline, baselineMax);
                    worstEngine = std::max(worstEngine, engineMax);
                    worstBaseline = std::max(worstBaseline, baselineMax);
                    worstRatio = std::max(worstRatio, engineMax / baselineMax);
                    QVERIFY2(engineMax < kCleanKlBound, qPrintable(where));
                    QVERIFY2(engineMax <= kNoiseFactor * baselineMax, qPrintable(where));
                }
        }
        qInfo("%s: engine rows' max KL %.3g nats, baseline rows' %.3g", c.name, caseEngine, caseBaseline);
    }
    qInfo("clean captures: engine rows' max KL %.3g nats, baseline rows' %.3g, largest engine / baseline %.2f",
          worstEngine, worstBaseline, worstRatio);
}

QTEST_GUILESS_MAIN(TestImpactCapture)
#include "tst_impact_capture.moc"
