// The what-if's quantisers against hand-worked cases and, on Gaussian data, against the
// error the formats' definitions give analytically (integrated here in double); and the
// what-if of a capture naming exactly the layers whose heads a per-tensor scale crushes.

#include "format/bundle_reader.h"
#include "format/dtype.h"
#include "kv/capture_loader.h"
#include "quant/quantiser.h"
#include "quant/whatif.h"
#include "synth/model_capture.h"

#include <QTemporaryDir>
#include <QTest>

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
    void namesTheLayersAPerTensorScaleCrushes();
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

QTEST_APPLESS_MAIN(TestWhatIf)
#include "tst_whatif.moc"
