// RoPE scalings (rope_frequencies.h) and the rotation under them (rope_settings.h) against a
// double-precision RoPE written here from transformers' formulas (modeling_rope_utils.py's
// _compute_*_parameters, the models' rotate_half and cos/sin times attention_scaling), not from
// the code under test: a Llama-3.1-8B-like llama3, DeepSeek-V3- and Qwen-like yarn, Phi-3-like
// longrope, dynamic NTK and Qwen2-VL's mrope, at positions within and beyond the original context.

#include "format/bundle_error.h"
#include "format/rope_frequencies.h"
#include "format/rope_settings.h"

#include <QtTest>

#include <cmath>
#include <random>
#include <string>
#include <vector>

using namespace kvscope;

namespace {

constexpr double kPi = 3.14159265358979323846;

// --- the reference: inverse frequencies from the formulas, one per rotated pair ----------
std::vector<double> plainFrequencies(double theta, int d)
{
    std::vector<double> w;
    for (int i = 0; i < d / 2; ++i)
        w.push_back(1.0 / std::pow(theta, double(2 * i) / d));
    return w;
}

// Llama 3.1: wavelength 2 pi / w against original / high (kept) and original / low (w / factor).
std::vector<double> llama3Frequencies(double theta, int d, double factor, double low, double high, double original)
{
    std::vector<double> w = plainFrequencies(theta, d);
    for (double& x : w) {
        const double wavelength = 2 * kPi / x;
        if (wavelength > original / low)
            x = x / factor;
        else if (wavelength >= original / high) {
            const double s = (original / wavelength - low) / (high - low);
            x = (1 - s) * (x / factor) + s * x;
        }
    }
    return w;
}

// YaRN: pair i interpolated (w / factor) by the ramp between the pairs turning beta_fast and
// beta_slow times over the original context (floored / ceiled, clamped to [0, d - 1]).
std::vector<double> yarnFrequencies(double theta, int d, double factor, double original, double betaFast, double betaSlow)
{
    const auto pairTurning = [&](double turns) { return d * std::log(original / (turns * 2 * kPi)) / (2 * std::log(theta)); };
    const double lo = std::max(0.0, std::floor(pairTurning(betaFast)));
    double hi = std::min(double(d - 1), std::ceil(pairTurning(betaSlow)));
    if (hi == lo)
        hi += 0.001;
    std::vector<double> w = plainFrequencies(theta, d);
    for (int i = 0; i < d / 2; ++i) {
        const double ramp = std::min(1.0, std::max(0.0, (i - lo) / (hi - lo)));
        w[std::size_t(i)] = ramp * (w[std::size_t(i)] / factor) + (1 - ramp) * w[std::size_t(i)];
    }
    return w;
}

// Rotated halves (HF rotate_half): pair (i, i + d / 2) turned by position * w_i, times m;
// values past d unchanged.
std::vector<double> rotated(const std::vector<double>& x, const std::vector<double>& w, double position, double m)
{
    std::vector<double> y = x;
    const std::size_t half = w.size();
    for (std::size_t i = 0; i < half; ++i) {
        const double angle = position * w[i], a = x[i], b = x[i + half];
        y[i] = m * (a * std::cos(angle) - b * std::sin(angle));
        y[i + half] = m * (b * std::cos(angle) + a * std::sin(angle));
    }
    return y;
}

std::vector<double> randomVector(int dim, unsigned seed)
{
    std::mt19937 rng(seed);
    std::normal_distribution<double> n;
    std::vector<double> v(static_cast<std::size_t>(dim));
    for (double& x : v)
        x = n(rng);
    return v;
}

RopeSettings parsed(const std::string& json)
{
    BundleMetadata m;
    m.extra["rope"] = json;
    const std::optional<RopeSettings> r = ropeSettingsOf(m, "f.h5");
    if (!r)
        throw std::runtime_error("no rope settings");
    return *r;
}

// RopeRotation under `json` against the reference at every position, forward and back.
void compare(const std::string& json, int dim, std::int64_t length, const std::vector<double>& w, double m,
             const std::vector<double>& positions)
{
    const RopeSettings rope = parsed(json);
    RopeRotation r(rope, dim, length);
    const std::vector<double> x = randomVector(dim, 7);
    std::vector<double> got(x.size()), back(x.size());
    for (double p : positions) {
        const std::vector<double> want = rotated(x, w, p, m);
        r.setPosition(p);
        r.apply(x.data(), got.data());
        for (std::size_t i = 0; i < x.size(); ++i)
            QVERIFY2(std::fabs(got[i] - want[i]) <= 1e-9 * (1 + std::fabs(want[i])),
                     qPrintable(QString::fromStdString(json).left(60) + " position " + QString::number(p) + " value " +
                                QString::number(i) + ": " + QString::number(got[i], 'g', 17) + " vs " +
                                QString::number(want[i], 'g', 17)));
        r.setPosition(p, true);
        r.apply(got.data(), back.data());
        for (std::size_t i = 0; i < x.size(); ++i)
            QVERIFY(std::fabs(back[i] - x[i]) <= 1e-9 * (1 + std::fabs(x[i])));
    }
}

}  // namespace

class TestRopeFrequencies : public QObject {
    Q_OBJECT

private slots:
    void llama3AsLlama31();
    void yarnAsDeepSeekAndQwen();
    void longRopeAsPhi3();
    void dynamicNtk();
    void mropeOfTextPositions();
    void aTurnComposesWithTheAttentionFactor();
    void badScalingsAreNamed();
};

void TestRopeFrequencies::llama3AsLlama31()
{
    // Llama-3.1-8B's config: theta 500000, head_dim 128, rope_scaling {factor 8, low 1, high 4,
    // original 8192}: pairs in all three bands.
    const std::string json = R"({"theta": 500000.0, "rotary_dim": 128, "style": "neox", "scaling": {"type": "llama3",
        "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}})";
    const std::vector<double> w = llama3Frequencies(500000.0, 128, 8, 1, 4, 8192);
    int kept = 0, slowed = 0, blended = 0;
    const std::vector<double> plain = plainFrequencies(500000.0, 128);
    for (std::size_t i = 0; i < w.size(); ++i)
        (w[i] == plain[i] ? kept : std::fabs(w[i] - plain[i] / 8) < 1e-18 ? slowed : blended)++;
    QVERIFY(kept > 0 && slowed > 0 && blended > 0);
    compare(json, 128, 0, w, 1.0, {0, 1, 17, 2047, 8191, 8192, 8193, 20000, 131071});
    // A partial rotary (the first 64 of 128 values) and a small original context.
    const std::string partial = R"({"theta": 10000, "rotary_dim": 16, "scaling": {"type": "llama3", "factor": 4,
        "low_freq_factor": 1, "high_freq_factor": 2, "original_max_position_embeddings": 64}})";
    compare(partial, 24, 0, llama3Frequencies(10000, 16, 4, 1, 2, 64), 1.0, {3, 63, 64, 65, 500});
}

void TestRopeFrequencies::yarnAsDeepSeekAndQwen()
{
    // DeepSeek-V3: qk_rope_head_dim 64, theta 10000, factor 40 over 4096, mscale = mscale_all_dim
    // = 1: attention factor 1.
    const std::string v3 = R"({"theta": 10000.0, "rotary_dim": 64, "scaling": {"type": "yarn", "factor": 40,
        "original_max_position_embeddings": 4096, "beta_fast": 32, "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0}})";
    compare(v3, 64, 0, yarnFrequencies(10000, 64, 40, 4096, 32, 1), 1.0, {0, 5, 4095, 4096, 50000, 163839});
    // DeepSeek-V2: mscale 0.707 = mscale_all_dim: their ratio is 1 too.
    const std::string v2 = R"({"theta": 10000.0, "rotary_dim": 64, "scaling": {"type": "yarn", "factor": 40,
        "original_max_position_embeddings": 4096, "mscale": 0.707, "mscale_all_dim": 0.707}})";
    compare(v2, 64, 0, yarnFrequencies(10000, 64, 40, 4096, 32, 1), 1.0, {7, 9000});
    // Qwen2.5 with YaRN (factor 4 over 32768, no mscale): attention factor 0.1 ln 4 + 1, so K
    // values come out 1.139 times longer.
    const std::string qwen = R"({"theta": 1000000.0, "rotary_dim": 128, "scaling": {"type": "yarn", "factor": 4.0,
        "original_max_position_embeddings": 32768}})";
    compare(qwen, 128, 0, yarnFrequencies(1e6, 128, 4, 32768, 32, 1), 0.1 * std::log(4.0) + 1, {0, 1, 32767, 32768, 131071});
    // mscale without mscale_all_dim: transformers takes get_mscale(factor), mscale unused.
    const std::string lone = R"({"theta": 10000.0, "rotary_dim": 32, "scaling": {"type": "yarn", "factor": 16,
        "original_max_position_embeddings": 256, "mscale": 0.707, "beta_fast": 16, "beta_slow": 2}})";
    compare(lone, 32, 0, yarnFrequencies(10000, 32, 16, 256, 16, 2), 0.1 * std::log(16.0) + 1, {1, 255, 256, 4000});
    // An explicit attention_factor wins.
    const std::string given = R"({"theta": 10000.0, "rotary_dim": 32, "scaling": {"type": "yarn", "factor": 16,
        "original_max_position_embeddings": 256, "attention_factor": 0.8}})";
    compare(given, 32, 0, yarnFrequencies(10000, 32, 16, 256, 32, 1), 0.8, {1, 300});
}

void TestRopeFrequencies::longRopeAsPhi3()
{
    // Phi-3-mini-128k-like, narrowed to 8 pairs: short factors up to original (4096), long ones
    // past it, picked by the forward's length; attention factor sqrt(1 + ln 32 / ln 4096).
    const std::vector<double> shortF{1.0, 1.1, 1.2, 1.5, 2.0, 2.5, 3.0, 3.5}, longF{1.0, 1.5, 3.0, 6.0, 12.0, 20.0, 30.0, 40.0};
    const std::string json = R"({"theta": 10000.0, "rotary_dim": 16, "scaling": {"type": "longrope", "factor": 32.0,
        "original_max_position_embeddings": 4096, "short_factor": [1.0, 1.1, 1.2, 1.5, 2.0, 2.5, 3.0, 3.5],
        "long_factor": [1.0, 1.5, 3.0, 6.0, 12.0, 20.0, 30.0, 40.0]}})";
    const double m = std::sqrt(1 + std::log(32.0) / std::log(4096.0));
    const auto withFactors = [](const std::vector<double>& ext) {
        std::vector<double> w;
        for (int i = 0; i < 8; ++i)
            w.push_back(1.0 / (ext[std::size_t(i)] * std::pow(10000.0, 2.0 * i / 16)));
        return w;
    };
    compare(json, 16, 100, withFactors(shortF), m, {0, 1, 99});
    compare(json, 16, 4096, withFactors(shortF), m, {0, 4095});
    compare(json, 16, 4097, withFactors(longF), m, {0, 1, 4095, 4096});
    compare(json, 16, 131072, withFactors(longF), m, {131071});
}

void TestRopeFrequencies::dynamicNtk()
{
    // Within max_position_embeddings the base is the model's; past it, theta * (f * L / M - f +
    // 1)^(d / (d - 2)) for the forward's length L.
    const std::string json = R"({"theta": 10000.0, "rotary_dim": 32, "scaling": {"type": "dynamic", "factor": 2.0,
        "max_position_embeddings": 2048}})";
    compare(json, 32, 0, plainFrequencies(10000, 32), 1.0, {0, 100, 2047});
    compare(json, 32, 2048, plainFrequencies(10000, 32), 1.0, {2047});
    for (std::int64_t length : {2049, 4096, 10000}) {
        const double base = 10000.0 * std::pow(2.0 * double(length) / 2048 - 1.0, 32.0 / 30.0);
        compare(json, 32, length, plainFrequencies(base, 32), 1.0, {0, 1, 2048, double(length - 1)});
    }
}

void TestRopeFrequencies::mropeOfTextPositions()
{
    // Qwen2-VL (apply_multimodal_rotary_pos_emb): cos and sin of the (temporal, height, width)
    // positions, sections [16, 24, 24] of the 64 pairs taken from component i % 3 of the
    // section list doubled. Text tokens have the three components equal: the plain rotation.
    const std::string json = R"({"theta": 1000000.0, "rotary_dim": 128, "scaling": {"type": "mrope", "mrope_section": [16, 24, 24]}})";
    const std::vector<double> w = plainFrequencies(1e6, 128);
    const std::vector<int> sections{16, 24, 24, 16, 24, 24};  // over the doubled 128 cos values
    const RopeSettings rope = parsed(json);
    const std::vector<double> x = randomVector(128, 3);
    for (double p : {0.0, 1.0, 77.0, 40000.0}) {
        const double position[3] = {p, p, p};
        std::vector<double> cosines, sines;  // emb = cat(freqs, freqs) per component, then sections
        int at = 0;
        for (std::size_t s = 0; s < sections.size(); ++s)
            for (int k = 0; k < sections[s]; ++k, ++at) {
                const double angle = position[s % 3] * w[std::size_t(at % 64)];
                cosines.push_back(std::cos(angle));
                sines.push_back(std::sin(angle));
            }
        std::vector<double> want(128), got(128);
        for (int i = 0; i < 128; ++i) {  // q * cos + rotate_half(q) * sin
            const double half = i < 64 ? -x[std::size_t(i + 64)] : x[std::size_t(i - 64)];
            want[std::size_t(i)] = x[std::size_t(i)] * cosines[std::size_t(i)] + half * sines[std::size_t(i)];
        }
        RopeRotation r(rope, 128);
        r.setPosition(p);
        r.apply(x.data(), got.data());
        for (int i = 0; i < 128; ++i)
            QVERIFY(std::fabs(got[std::size_t(i)] - want[std::size_t(i)]) < 1e-9);
    }
}

void TestRopeFrequencies::aTurnComposesWithTheAttentionFactor()
{
    // K rotated for t, turned by d, is K rotated for t + d: the attention factor is applied once.
    const RopeSettings rope = parsed(R"({"theta": 10000.0, "rotary_dim": 16, "scaling": {"type": "yarn", "factor": 8,
        "original_max_position_embeddings": 64}})");
    RopeRotation at(rope, 16), turn(rope, 16);
    const std::vector<double> x = randomVector(16, 5);
    std::vector<double> k(16), turned(16), direct(16);
    at.setPosition(30);
    at.apply(x.data(), k.data());
    turn.setTurn(7);
    turn.apply(k.data(), turned.data());
    at.setPosition(37);
    at.apply(x.data(), direct.data());
    for (int i = 0; i < 16; ++i)
        QVERIFY(std::fabs(turned[std::size_t(i)] - direct[std::size_t(i)]) < 1e-12);
}

void TestRopeFrequencies::badScalingsAreNamed()
{
    const std::vector<std::pair<std::string, std::string>> bad = {
        {R"({"theta": 1e4, "scaling": {"type": "su"}})", "scaling type 'su'"},
        {R"({"theta": 1e4, "scaling": {"type": "llama3", "factor": 8, "low_freq_factor": 1,
            "original_max_position_embeddings": 8192}})", "high_freq_factor"},
        {R"({"theta": 1e4, "scaling": {"type": "llama3", "factor": 8, "low_freq_factor": 4, "high_freq_factor": 1,
            "original_max_position_embeddings": 8192}})", "at least its 'low_freq_factor'"},
        {R"({"theta": 1e4, "scaling": {"type": "yarn", "factor": 4, "original_max_position_embeddings": 4096,
            "beta": 3}})", "does not take 'beta'"},
        {R"({"theta": 1e4, "scaling": {"type": "yarn", "factor": 4}})", "original_max_position_embeddings"},
        {R"({"theta": 1e4, "scaling": {"type": "yarn", "factor": 4, "original_max_position_embeddings": 4096,
            "truncate": "yes"}})", "'truncate'"},
        {R"({"theta": 1e4, "rotary_dim": 4, "scaling": {"type": "longrope", "factor": 2, "original_max_position_embeddings": 64,
            "short_factor": [1, 1, 1], "long_factor": [1, 2]}})", "has 3 factors for 2 rotated pairs"},
        {R"({"theta": 1e4, "scaling": {"type": "longrope", "factor": 2, "original_max_position_embeddings": 64,
            "short_factor": [1, 1], "long_factor": [1, 2]}})", "needs 'rotary_dim'"},
        {R"({"theta": 1e4, "rotary_dim": 4, "scaling": {"type": "longrope", "factor": 2, "original_max_position_embeddings": 64,
            "short_factor": [1, -1], "long_factor": [1, 2]}})", "list of positive numbers"},
        {R"({"theta": 1e4, "scaling": {"type": "dynamic", "factor": 2}})", "max_position_embeddings"},
        {R"({"theta": 1e4, "rotary_dim": 8, "scaling": {"type": "mrope", "mrope_section": [1, 1, 1]}})", "covers 3 pairs"},
        {R"({"theta": 1e4, "scaling": {"type": "mrope"}})", "needs 'mrope_section'"},
        {R"({"theta": 1e4, "scaling": {"type": "linear", "factor": 0}})", "positive number 'factor'"},
    };
    for (const auto& [json, what] : bad) {
        try {
            parsed(json);
            QFAIL(json.c_str());
        } catch (const BundleError& e) {
            const QString text = e.what();
            QVERIFY2(text.contains("f.h5") && text.contains("'rope'") && text.contains(QString::fromStdString(what)), e.what());
        }
    }
    // The names transformers uses for each, and linear still a position scale.
    QCOMPARE(ropeScalingName(RopeScalingType::Llama3), std::string("llama3"));
    QCOMPARE(parsed(R"({"theta": 1e4, "scaling": {"type": "linear", "factor": 4}})").positionScale, 4.0);
    QVERIFY(parsed(R"({"theta": 1e4, "scaling": {"type": "default"}})").scaling.type == RopeScalingType::Default);
}

QTEST_APPLESS_MAIN(TestRopeFrequencies)
#include "tst_rope_frequencies.moc"
