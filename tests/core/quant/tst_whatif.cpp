// The what-if's quantisers against hand-worked cases and, on Gaussian data, against the
// error the formats' definitions give analytically (integrated here in double); and the
// what-if of a capture naming exactly the layers whose heads a per-tensor scale crushes.

#include "format/bundle_reader.h"
#include "format/dtype.h"
#include "format/int4_rht.h"
#include "kv/capture_loader.h"
#include "quant/quantiser.h"
#include "quant/whatif.h"
#include "synth/model_capture.h"

#include <QTemporaryDir>
#include <QTest>

#include <bit>
#include <cmath>
#include <random>
#include <tuple>

using namespace kvscope;

class TestWhatIf : public QObject {
    Q_OBJECT

private slots:
    void gaussianMatchesTheAnalyticError();
    void int4GroupsByHand();
    void fastGridIsTheCodecsGrid();
    void vllmStaticScalesSaturate();
    void kiviKeepsTheRecentTokens();
    void int4TokenHeadRhtIsVllms();
    void nvfp4IsVllmsFormula();
    void namesTheLayersAPerTensorScaleCrushes();
    void thePercentileShowsWhatTheMedianHides();
};

namespace {

// E[(Q(x) - x)^2] for x ~ N(0, 1) quantised to a float format with `mantissa` bits, minimum
// normal exponent `minExponent`, after dividing by `scale`: within a binade [2^e, 2^(e+1)) the
// rounding error is uniform over one step 2^(e - mantissa) (variance step^2 / 12); below the
// normal range the step is that of the smallest binade. Integrated with the normal density.
double analyticRelativeRms(int mantissa, int minExponent, double scale)
{
    const auto phi = [](double x) { return std::exp(-x * x / 2) / std::sqrt(2 * M_PI); };
    double variance = 0;
    const double dx = 1e-4;
    for (double x = dx / 2; x < 9; x += dx) {
        const double v = x / scale;
        const int e = std::max(minExponent, int(std::floor(std::log2(v))));
        const double step = std::ldexp(1.0, e - mantissa) * scale;
        variance += 2 * phi(x) * step * step / 12 * dx;
    }
    return std::sqrt(variance);  // E[x^2] = 1
}

QuantiseStats run(const QuantScheme& s, std::vector<float>& x, std::int64_t seq, int heads, int dim,
                  std::vector<float>& out, bool isK = true, float warmup = 0)
{
    std::vector<std::uint8_t> present(std::size_t(seq), 1);
    out.assign(x.size(), 0);
    return quantise(s, {x.data(), present.data(), seq, heads, dim, isK, warmup}, out.data());
}

}  // namespace

void TestWhatIf::gaussianMatchesTheAnalyticError()
{
    std::mt19937 rng(5);
    std::normal_distribution<float> n01;
    const std::int64_t seq = 4096;
    std::vector<float> x(std::size_t(seq) * 128);
    for (float& v : x)
        v = n01(rng);
    float amax = 0;
    for (float v : x)
        amax = std::max(amax, std::fabs(v));
    struct Case {
        QuantScheme::Format format;
        int mantissa, minExponent;
        double largest;
    };
    for (const Case& c : {Case{QuantScheme::Format::Fp8E4M3, 3, -6, 448.0}, Case{QuantScheme::Format::Fp8E5M2, 2, -14, 57344.0}}) {
        std::vector<float> q;
        const QuantiseStats st = run({c.format, QuantScheme::Scaling::Tensor}, x, seq, 1, 128, q);
        QCOMPARE(st.saturated, std::int64_t(0));
        double err = 0, ref = 0;
        for (std::size_t i = 0; i < x.size(); ++i)
            err += double(q[i] - x[i]) * double(q[i] - x[i]), ref += double(x[i]) * x[i];
        const double measured = std::sqrt(err / ref);
        const double analytic = analyticRelativeRms(c.mantissa, c.minExponent, amax / c.largest);
        qInfo("mantissa %d: relative RMS error %.4f%%, analytic %.4f%%", c.mantissa, 100 * measured, 100 * analytic);
        QVERIFY2(std::fabs(measured / analytic - 1) < 0.10, "within 10% of the analytic error");
    }
    // What the papers quote without clipping, about 0.21 x 2^-m: e4m3 2.7%, bf16 0.17%.
    QVERIFY(std::fabs(analyticRelativeRms(3, -1000, 1.0) / 0.027 - 1) < 0.1);
    std::vector<double> floors;
    for (std::size_t i = 0; i + 128 <= x.size(); i += 128)
        floors.push_back(bf16RoundingFloor(x.data() + i, 128));
    std::sort(floors.begin(), floors.end());
    const double bf16 = analyticRelativeRms(7, -1000, 1.0);
    qInfo("bf16 rounding floor: median %.4f%%, analytic %.4f%%", 100 * floors[floors.size() / 2], 100 * bf16);
    QVERIFY(std::fabs(floors[floors.size() / 2] / bf16 - 1) < 0.10);
    QVERIFY(std::fabs(bf16 / 0.0017 - 1) < 0.1);
}

void TestWhatIf::fastGridIsTheCodecsGrid()
{
    // Every finite bf16 value within the format's range, with a scale of exactly 1 (amax = the
    // format's largest value): the what-if's vectorised grid gives the codec's value.
    for (const auto& [format, dtype, largest] : {std::tuple{QuantScheme::Format::Fp8E4M3, DType::Float8E4M3, 448.0f},
                                                 std::tuple{QuantScheme::Format::Fp8E5M2, DType::Float8E5M2, 57344.0f}}) {
        std::vector<float> x;
        for (unsigned pattern = 0; pattern < 65536; ++pattern)
            if (const float v = bf16ToFloat(std::uint16_t(pattern)); std::isfinite(v) && std::fabs(v) <= largest)
                x.push_back(v);
        x.push_back(largest);
        std::vector<float> q;
        run({format, QuantScheme::Scaling::Tensor}, x, std::int64_t(x.size()), 1, 1, q);
        for (std::size_t i = 0; i < x.size(); ++i)
            if (q[i] != roundToDType(dtype, x[i]) || std::signbit(q[i]) != std::signbit(roundToDType(dtype, x[i])))
                QFAIL(qPrintable(QString("%1: %2 -> %3, the codec gives %4").arg(QString::fromStdString(dtypeName(dtype)))
                                     .arg(double(x[i]), 0, 'g', 9).arg(double(q[i]), 0, 'g', 9)
                                     .arg(double(roundToDType(dtype, x[i])), 0, 'g', 9)));
    }
}

void TestWhatIf::int4GroupsByHand()
{
    // One group of 4: min -1, max 2: scale 3/15 = 0.2, zero point round(1 / 0.2) = 5.
    // 0.5 -> round(2.5) = 2 (even) + 5 = 7 -> (7 - 5) * 0.2 = 0.4; 1.1 -> round(5.5) = 6 + 5 = 11 -> 1.2.
    std::vector<float> x{-1.0f, 0.5f, 1.1f, 2.0f}, q;
    run({QuantScheme::Format::Int4, QuantScheme::Scaling::Group, 4}, x, 1, 1, 4, q);
    const std::vector<float> expected{-1.0f, 0.4f, 1.2f, 2.0f};
    for (int i = 0; i < 4; ++i)
        QVERIFY2(std::fabs(q[std::size_t(i)] - expected[std::size_t(i)]) < 1e-6f, qPrintable(QString::number(i)));
}

void TestWhatIf::vllmStaticScalesSaturate()
{
    // K scale = warm-up amax / 200 = 0.01: the e4m3 range reaches 4.48; 5 and -6 saturate to it.
    std::vector<float> x{1.0f, 5.0f, -6.0f, 0.5f}, q;
    const QuantiseStats st = run({QuantScheme::Format::Fp8E4M3, QuantScheme::Scaling::VllmStatic}, x, 1, 1, 4, q, true, 2.0f);
    QCOMPARE(st.saturated, std::int64_t(2));
    QCOMPARE(q[1], 4.48f);
    QCOMPARE(q[2], -4.48f);
    // 1 / 0.01 = 100 lies halfway between e4m3's 96 (1.100b x 2^6) and 104 (1.101b x 2^6): the even one.
    QCOMPARE(q[0], 0.96f);
}

void TestWhatIf::kiviKeepsTheRecentTokens()
{
    std::mt19937 rng(2);
    std::normal_distribution<float> n01;
    const std::int64_t seq = 40;
    std::vector<float> x(std::size_t(seq) * 2 * 8), q;
    for (float& v : x)
        v = n01(rng);
    run({QuantScheme::Format::Int4, QuantScheme::Scaling::Kivi, 4, 32}, x, seq, 2, 8, q);
    for (std::size_t i = 8 * 16; i < x.size(); ++i)  // the last 32 tokens as they were
        QCOMPARE(q[i], x[i]);
    int changed = 0;
    for (std::size_t i = 0; i < 8 * 16; ++i)
        changed += q[i] != x[i];
    QVERIFY(changed > 100);
}

namespace {

// H[i][j] = (-1)^popcount(i & j): the unnormalised Walsh-Hadamard matrix, applied in O(d^2).
std::vector<double> hadamardProduct(const std::vector<double>& x)
{
    std::vector<double> y(x.size(), 0.0);
    for (std::size_t i = 0; i < x.size(); ++i)
        for (std::size_t j = 0; j < x.size(); ++j)
            y[i] += (std::popcount(i & j) % 2 ? -1.0 : 1.0) * x[j];
    return y;
}

// The nearest magnitude of `grid` (codes in increasing order) to |x|, ties to the even code.
double nearest(const std::vector<double>& grid, double x)
{
    std::size_t best = 0;
    for (std::size_t c = 1; c < grid.size(); ++c) {
        const double d = std::fabs(grid[c] - std::fabs(x)), e = std::fabs(grid[best] - std::fabs(x));
        if (d < e || (d == e && c % 2 == 0))
            best = c;
    }
    return std::copysign(grid[best], x);
}

}  // namespace

void TestWhatIf::int4TokenHeadRhtIsVllms()
{
    // docs/whatif.md: kvscope's signs are the bits of SplitMix64 seeded 0x9E3779B9, bit i of draw
    // i / 64 set giving -1. Written here again.
    const int dim = 64;
    std::vector<double> signs;
    std::uint64_t state = 0x9E3779B9u, draw = 0;
    for (int i = 0; i < dim; ++i) {
        if (i % 64 == 0) {
            std::uint64_t z = (state += 0x9E3779B97F4A7C15ull);
            z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
            z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
            draw = z ^ (z >> 31);
        }
        signs.push_back((draw >> (i % 64)) & 1u ? -1.0 : 1.0);
    }
    const std::vector<std::int8_t> kvscopes = kvscopeRhtSigns(dim);
    for (int i = 0; i < dim; ++i)
        QCOMPARE(double(kvscopes[std::size_t(i)]), signs[std::size_t(i)]);

    std::string error;
    const auto scheme = parseScheme("int4/token_head_rht", error);
    QVERIFY(scheme);
    QCOMPARE(scheme->name(), std::string("int4/token_head_rht"));
    QCOMPARE(scheme->bits(), 4);
    std::mt19937 rng(19);
    std::normal_distribution<float> n01;
    const std::int64_t seq = 6;
    const int heads = 2;
    std::vector<float> x(std::size_t(seq) * heads * dim), out;
    for (float& v : x)
        v = n01(rng) * 3.0f;
    run(*scheme, x, seq, heads, dim, out);
    // vLLM's int4_per_token_head in double: rotate, asymmetric over the head, decode, rotate back.
    for (std::int64_t t = 0; t < seq; ++t)
        for (int h = 0; h < heads; ++h) {
            const std::size_t at = (std::size_t(t) * heads + std::size_t(h)) * dim;
            std::vector<double> row;
            for (int i = 0; i < dim; ++i)
                row.push_back(double(x[at + std::size_t(i)]) * signs[std::size_t(i)]);
            const std::vector<double> rotated = hadamardProduct(row);
            const double lo = *std::min_element(rotated.begin(), rotated.end());
            const double hi = *std::max_element(rotated.begin(), rotated.end());
            const double scale = std::max((hi - lo) / 15, 1e-6);
            const double zp = std::clamp(std::round(-lo / scale), 0.0, 15.0);
            std::vector<double> decoded;
            for (double r : rotated)
                decoded.push_back((std::clamp(std::round(r / scale + zp), 0.0, 15.0) - zp) * scale);
            const std::vector<double> back = hadamardProduct(decoded);
            for (int i = 0; i < dim; ++i) {
                const double expected = back[std::size_t(i)] / dim * signs[std::size_t(i)];
                QVERIFY2(std::fabs(out[at + std::size_t(i)] - expected) <= 1e-6 * (hi - lo),
                         qPrintable(QString("t %1 h %2 i %3: %4, expected %5").arg(t).arg(h).arg(i).arg(out[at + std::size_t(i)]).arg(expected)));
            }
        }
    // A width that is not a power of two is padded with zeros: 48 values within int4's bound.
    std::vector<float> narrow(std::size_t(seq) * 48), q48;
    for (float& v : narrow)
        v = n01(rng);
    run(*scheme, narrow, seq, 1, 48, q48);
    for (std::int64_t t = 0; t < seq; ++t) {
        double err2 = 0, lo = 0, hi = 0;
        for (int i = 0; i < 48; ++i) {
            err2 += std::pow(double(q48[std::size_t(t) * 48 + std::size_t(i)]) - narrow[std::size_t(t) * 48 + std::size_t(i)], 2);
            lo = std::min(lo, double(narrow[std::size_t(t) * 48 + std::size_t(i)]));
            hi = std::max(hi, double(narrow[std::size_t(t) * 48 + std::size_t(i)]));
        }
        // ||x - x'|| <= the rotated error's ||.|| / sqrt(64) <= scale / 2, scale <= 2 x 8 x max|x| / 15
        QVERIFY(std::sqrt(err2) <= 16.0 * std::max(-lo, hi) / 15.0 / 2.0 * 1.001);
    }
}

void TestWhatIf::nvfp4IsVllmsFormula()
{
    // The grids from their definitions: e2m1 magnitudes, e4m3fn's 127 finite non-negative values.
    std::vector<double> e2m1{0, 0.5, 1, 1.5, 2, 3, 4, 6}, e4m3;
    for (int c = 0; c < 127; ++c) {
        const int exponent = c >> 3, mantissa = c & 7;
        e4m3.push_back(exponent == 0 ? mantissa / 8.0 * std::ldexp(1.0, -6) : (1 + mantissa / 8.0) * std::ldexp(1.0, exponent - 7));
    }
    std::string error;
    const auto scheme = parseScheme("nvfp4", error);
    QVERIFY(scheme);
    std::mt19937 rng(29);
    std::normal_distribution<float> n01;
    const std::int64_t seq = 16;
    const int heads = 2, dim = 32;
    std::vector<float> x(std::size_t(seq) * heads * dim), out;
    double amax = 0;
    for (std::size_t i = 0; i < x.size(); ++i) {
        x[i] = n01(rng) * (i / dim % 2 ? 1.0f : 1.0f / 64);  // a quiet head: its blocks' scales small
        amax = std::max(amax, std::fabs(double(x[i])));
    }
    run(*scheme, x, seq, heads, dim, out);
    // docs/whatif.md: global = amax / (6 x 448); per 16 values of a head SF = e4m3(amax16 / global
    // / 6); q = e2m1(x / global / SF), saturated; decoded q x SF x global.
    const double global = double(float(amax / (6.0 * 448.0)));
    int ties = 0;
    for (std::size_t b = 0; b < x.size(); b += 16) {
        double blockMax = 0;
        for (std::size_t i = b; i < b + 16; ++i)
            blockMax = std::max(blockMax, std::fabs(double(x[i])));
        const double sf = nearest(e4m3, std::min(blockMax / global / 6.0, 448.0));
        for (std::size_t i = b; i < b + 16; ++i) {
            const double q = double(x[i]) / global / sf;
            const double expected = nearest(e2m1, std::clamp(q, -6.0, 6.0)) * sf * global;
            // (float's division may land a value at a tie the other side of double's: count them)
            if (std::fabs(double(out[i]) - expected) > 1e-6 * std::fabs(expected)) {
                QVERIFY2(std::fabs(std::fabs(q) * 4 - std::round(std::fabs(q) * 4)) < 1e-5,
                         qPrintable(QString("value %1: %2, expected %3").arg(i).arg(out[i]).arg(expected)));
                ++ties;
            }
        }
    }
    QVERIFY(ties <= 2);
}

void TestWhatIf::namesTheLayersAPerTensorScaleCrushes()
{
    QTemporaryDir dir;
    synth::ModelCaptureOptions o;
    o.shape.layers = 6;
    o.shape.quietHeadLayers = {1, 4};
    o.shape.quietHeadOctaves = 14;  // head 0 below e4m3's smallest subnormal under the tensor's scale
    o.promptLens = {40, 56};
    const std::string path = dir.filePath("quiet.h5").toStdString();
    synth::writeModelCapture(path, o);
    const CaptureLoader loader(std::make_shared<BundleReader>(path));
    WhatIfOptions options;
    options.schemes = {{QuantScheme::Format::Fp8E4M3, QuantScheme::Scaling::Tensor},
                       {QuantScheme::Format::Fp8E4M3, QuantScheme::Scaling::Head}};
    const WhatIfResult r = runWhatIf(loader, options);
    QCOMPARE(r.floor, std::string("baseline"));
    std::vector<std::string> hurt[2];
    for (int s = 0; s < 2; ++s)
        for (const WhatIfLayer& l : r.schemes[std::size_t(s)].layers) {
            if (l.hurt)
                hurt[s].push_back(l.layer);
            // The quiet head is the worst one of a hurt layer.
            if (l.hurt)
                QCOMPARE(l.worstHead[0], 0);
        }
    qInfo("%s", r.schemes[0].verdict.c_str());
    QCOMPARE(hurt[0], (std::vector<std::string>{"model.layers.1.self_attn", "model.layers.4.self_attn"}));
    QVERIFY2(hurt[1].empty(), "per-head scales fit every head");
    // Every layer's median error is e4m3's own: the quiet heads are one head of several.
    for (const WhatIfLayer& l : r.schemes[1].layers)
        QVERIFY(l.relL2Median[0] > 0.02 && l.relL2Median[0] < 0.035);
}

// KIVI keeps the last 32 tokens in full precision: most cells are untouched, their median error
// 0 floors, while the quantised tokens are well off. The 90th percentile is the map's: over each
// prompt's tokens of the layer's row (a token's worst head), recomputed here.
void TestWhatIf::thePercentileShowsWhatTheMedianHides()
{
    QTemporaryDir dir;
    synth::ModelCaptureOptions o;
    o.shape.layers = 2;
    o.promptLens = {40, 56};
    const std::string path = dir.filePath("kivi.h5").toStdString();
    synth::writeModelCapture(path, o);
    const CaptureLoader loader(std::make_shared<BundleReader>(path));
    WhatIfOptions options;
    options.schemes = {{QuantScheme::Format::Int4, QuantScheme::Scaling::Kivi, 4, 32}};
    const WhatIfResult r = runWhatIf(loader, options);
    const WhatIfScheme& kivi = r.schemes[0];
    bool hidden = false;
    for (std::size_t l = 0; l < kivi.layers.size(); ++l)
        for (std::size_t part = 0; part < 2; ++part) {
            std::vector<double> tokens;
            for (std::size_t p = 0; p < kivi.maps.size(); ++p) {
                const auto seq = std::size_t(r.promptTokens[p]);
                for (std::size_t t = 0; t < seq; ++t)
                    if (std::isfinite(kivi.maps[p][part][l * seq + t]))
                        tokens.push_back(kivi.maps[p][part][l * seq + t]);
            }
            std::sort(tokens.begin(), tokens.end());
            QCOMPARE(kivi.layers[l].floorRatioP90[part], tokens[std::min(tokens.size() - 1, std::size_t(0.9 * double(tokens.size())))]);
            hidden = hidden || (kivi.layers[l].floorRatioMedian[part] == 0 && kivi.layers[l].floorRatioP90[part] > 2);
        }
    QVERIFY2(hidden, "a layer whose median is 0 floors and whose p90 is well off");
}

QTEST_APPLESS_MAIN(TestWhatIf)
#include "tst_whatif.moc"
