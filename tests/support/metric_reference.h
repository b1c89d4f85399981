#pragma once
// Independent references for the metric tests: plain double-precision implementations
// written from the definitions (docs/analysis-json.md), and the small synthetic capture
// several suites analyse.

#include "analysis/analysis_result.h"
#include "kv/layer_kv.h"
#include "synth/synthetic_capture.h"

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

namespace kvtest {

using namespace kvscope;


// ---- independent reference implementations ----

struct Ref {
    double cos, linf, l2;
};

inline Ref referenceMetrics(const float* a, const float* b, int n)
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
inline double referenceBc(const std::vector<double>& a, const std::vector<double>& b)
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

inline LayerKv randomLayer(int heads, std::int64_t seq, int dim, std::mt19937& rng, float noise, const LayerKv* around = nullptr)
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

inline std::vector<double> errors(const LayerKv& ref, const LayerKv& x, std::int64_t t, KvPart part, int onlyHead = -1)
{
    std::vector<double> e;
    for (int h = 0; h < ref.heads; ++h) {
        if (onlyHead >= 0 && h != onlyHead)
            continue;
        const float* a = part == KvPart::K ? ref.kAt(h, t) : ref.vAt(h, t);
        const float* b = part == KvPart::K ? x.kAt(h, t) : x.vAt(h, t);
        for (int d = 0; d < ref.headDim(part); ++d)
            e.push_back(std::fabs(a[d] - b[d]));
    }
    return e;
}

inline PromptAnalysis emptyPrompt(int layers, std::int64_t tokens, int heads, bool threeWay)
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

// A three-way cell's error ratio from an analysis's metrics, in double: the largest head's
// actual L-inf over the largest head's base L-inf (a bf16 cache: no quantisation floor).
inline double referenceCellRatio(const PromptAnalysis& p, int layer, std::int64_t token, KvPart part)
{
    const Metric actual = metricFor(part, MetricKind::Linf);
    double most = std::nan(""), floor = std::nan("");
    for (int h = 0; h < p.headsOf(layer); ++h) {
        const double a = p.value(actual, layer, token, h), b = p.value(baseOf(actual), layer, token, h);
        if (std::isfinite(a) && !(a <= most))
            most = a;
        if (std::isfinite(b) && !(b <= floor))
            floor = b;
    }
    return most / std::max(floor, 1e-10);
}

inline bool close(double a, double b, double rel = 2e-6)
{
    return std::abs(a - b) <= rel * std::max(1.0, std::abs(b));
}


// BC against the noise floor by its definition: eight bins per octave of the error's
// magnitude (frexp), zero in its own bin; p and q the two sets' shares; sum of sqrt(p q).
inline int referenceLogBin(double e)
{
    if (e == 0)
        return 0;
    if (std::isinf(e))
        return 2040;
    int exponent = 0;
    const double m = std::frexp(e, &exponent);  // e = m 2^exponent, m in [0.5, 1)
    const int biased = exponent + 126;          // float32's exponent field of e
    if (biased <= 0)                            // subnormal: the mantissa's bits are e / 2^-149
        return int(std::ldexp(e, 149)) >> 20;
    return biased * 8 + int((2 * m - 1) * 8);
}

inline double referenceBcVsNoise(const std::vector<double>& base, const std::vector<double>& actual)
{
    std::vector<double> p(2041), q(2041);
    double nb = 0, na = 0;
    for (double e : base)
        if (!std::isnan(e))
            p[std::size_t(referenceLogBin(e))] += 1, nb += 1;
    for (double e : actual)
        if (!std::isnan(e))
            q[std::size_t(referenceLogBin(e))] += 1, na += 1;
    if (nb == 0 || na == 0)
        return std::nan("");
    double bc = 0;
    for (std::size_t i = 0; i < p.size(); ++i)
        bc += std::sqrt(p[i] / nb * q[i] / na);
    return std::clamp(bc, 0.0, 1.0);
}

// A small model-free capture: 4 layers, three prompts, a fault in layer 3, a divergence;
// `slidingHeadDim`, `slidingKvHeads`: the sliding layers' own head size and KV head count (0:
// the full layers').
inline void writeSmallCapture(const std::string& path, int slidingHeadDim = 0, int slidingKvHeads = 0)
{
    SyntheticCaptureOptions o = demoCaptureOptions();
    o.slidingHeadDim = slidingHeadDim;
    o.slidingKvHeads = slidingKvHeads;
    o.layers = 4;
    o.promptLens = {20, 31, 26};
    o.decodeTokens = 12;
    o.faultLayer = 3;
    o.divergence = 4;
    writeSyntheticCapture(path, o);
}

}  // namespace kvtest
