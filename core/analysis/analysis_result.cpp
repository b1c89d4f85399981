#include "analysis/analysis_result.h"

#include <algorithm>
#include <cctype>
#include <exception>
#include <limits>
#include <thread>

namespace kvscope {

const char* metricName(Metric metric)
{
    static const char* const names[kMetricCount] = {
        "k_cos", "v_cos", "k_linf", "v_linf", "k_l2", "v_l2",
        "base_k_cos", "base_v_cos", "base_k_linf", "base_v_linf", "base_k_l2", "base_v_l2"};
    return names[int(metric)];
}

bool isBaseMetric(Metric metric)
{
    return int(metric) >= int(Metric::BaseKCos);
}

std::int64_t smallestGenerationValues(const AnalysisResult& result)
{
    if (!result.aggregate)
        return 0;
    std::int64_t values = 0;
    for (const std::string& id : result.aggregate->promptIds)
        for (const PromptAnalysis& p : result.prompts)
            if (p.id == id) {
                values += smallestTokenValues(p);
                break;
            }
    return values;
}

std::string partTitle(const PromptAnalysis& p, KvPart part)
{
    std::string name = partName(p, part);
    if (name.size() == 1)
        name[0] = char(std::toupper(static_cast<unsigned char>(name[0])));
    return name;
}

std::string partsNamed(const PromptAnalysis& p, const std::string& kv)
{
    if (kv == "k")
        return partName(p, KvPart::K);
    if (kv == "v")
        return partName(p, KvPart::V);
    return partName(p, KvPart::K) + " and " + partName(p, KvPart::V);
}

Metric baseOf(Metric metric)
{
    return isBaseMetric(metric) ? metric : Metric(int(metric) + int(Metric::BaseKCos));
}

Metric metricFor(KvPart part, MetricKind kind)
{
    return Metric(int(kind) * 2 + (part == KvPart::V ? 1 : 0));  // KCos, VCos, KLinf, ... in that order
}

void PromptAnalysis::clearLayer(int layer)
{
    const float nan = std::numeric_limits<float>::quiet_NaN();
    const std::size_t rowCells = std::size_t(tokens) * std::size_t(heads);
    for (auto& m : metrics)
        if (!m.empty())
            std::fill_n(m.begin() + std::ptrdiff_t(std::size_t(layer) * rowCells), rowCells, nan);
    for (auto* pair : {&bc, &bcVsNoise, &quantLinf, &quantL2})
        for (auto& b : *pair)
            if (!b.empty())
                std::fill_n(b.begin() + std::ptrdiff_t(std::size_t(layer) * std::size_t(tokens)), std::size_t(tokens), nan);
    nonFinite.erase(std::remove_if(nonFinite.begin(), nonFinite.end(),
                                   [layer](const NonFiniteCell& c) { return c.layer == layer; }),
                    nonFinite.end());
    cacheScales[std::size_t(layer)] = {};
    replicaDifferences.erase(std::remove_if(replicaDifferences.begin(), replicaDifferences.end(),
                                            [&](const ReplicaDifference& d) { return d.layer == layers[std::size_t(layer)]; }),
                             replicaDifferences.end());
}

namespace {

bool anyQuantised(const PromptAnalysis& p)
{
    return std::any_of(p.layerDtypes.begin(), p.layerDtypes.end(), isQuantised);
}

}  // namespace

std::size_t PromptAnalysis::resultBytes() const
{
    const std::size_t rows = layers.size() * std::size_t(tokens);
    return (std::size_t(kMetricCount) * rows * std::size_t(heads) + (anyQuantised(*this) ? 8 : 4) * rows) * sizeof(float);
}

void PromptAnalysis::allocate(const std::string& spillDirectory)
{
    const float nan = std::numeric_limits<float>::quiet_NaN();
    const std::size_t cells = layers.size() * std::size_t(tokens) * std::size_t(heads);
    std::vector<std::pair<SpillableArray*, std::size_t>> arrays;
    for (auto& m : metrics)
        arrays.emplace_back(&m, cells);
    const bool quantised = anyQuantised(*this);
    cacheScales.assign(layers.size(), CacheScales{});
    for (auto* pair : {&quantLinf, &quantL2})
        for (auto& b : *pair)
            b.clear();
    for (auto* pair : {&bc, &bcVsNoise, &quantLinf, &quantL2})
        for (auto& b : *pair)
            if (quantised || (pair != &quantLinf && pair != &quantL2))
                arrays.emplace_back(&b, layers.size() * std::size_t(tokens));
    // Filling them is their first touch: page faults that cost a VM up to 3 ms a megabyte
    // (65 MB for 80 layers of 8 heads x 2048 tokens), so large results are filled by two threads.
    auto fill = [&](std::size_t first, std::size_t step) {
        for (std::size_t i = first; i < arrays.size(); i += step)
            arrays[i].first->assign(arrays[i].second, nan, spillDirectory);
    };
    if (cells * sizeof(float) < kLargeBuffer) {
        fill(0, 1);
        return;
    }
    std::exception_ptr helperFailed;  // (a temporary file that cannot be made)
    std::thread helper([&] {
        try {
            fill(1, 2);
        } catch (...) {
            helperFailed = std::current_exception();
        }
    });
    try {
        fill(0, 2);
    } catch (...) {
        helper.join();
        throw;
    }
    helper.join();
    if (helperFailed)
        std::rethrow_exception(helperFailed);
}

void PromptAnalysis::releaseLayer(int layer) const
{
    const std::size_t rowCells = std::size_t(tokens) * std::size_t(heads);
    for (const auto& m : metrics)
        if (!m.empty())
            m.release(std::size_t(layer) * rowCells, rowCells);
    for (const auto* pair : {&bc, &bcVsNoise, &quantLinf, &quantL2})
        for (const auto& b : *pair)
            if (!b.empty())
                b.release(std::size_t(layer) * std::size_t(tokens), std::size_t(tokens));
}

HeadReduction maxOverHeads(const PromptAnalysis& p, Metric m, int layer, std::int64_t token)
{
    HeadReduction r;
    for (int h = 0; h < p.heads; ++h) {
        const float v = p.value(m, layer, token, h);
        if (!std::isnan(v) && (r.head < 0 || v > r.value)) {
            r.value = v;
            r.head = h;
        }
    }
    return r;
}

HeadReduction minOverHeads(const PromptAnalysis& p, Metric m, int layer, std::int64_t token)
{
    HeadReduction r;
    for (int h = 0; h < p.heads; ++h) {
        const float v = p.value(m, layer, token, h);
        if (!std::isnan(v) && (r.head < 0 || v < r.value)) {
            r.value = v;
            r.head = h;
        }
    }
    return r;
}

float meanOverHeads(const PromptAnalysis& p, Metric m, int layer, std::int64_t token)
{
    double sum = 0;
    int n = 0;
    for (int h = 0; h < p.heads; ++h) {
        const float v = p.value(m, layer, token, h);
        if (!std::isnan(v)) {
            sum += v;
            ++n;
        }
    }
    return n ? float(sum / n) : std::nanf("");
}

float noiseFloor(const PromptAnalysis& p, Metric actual, int layer, std::int64_t token)
{
    const float base = maxOverHeads(p, baseOf(actual), layer, token).value;
    const KvPart part = int(actual) % 2 ? KvPart::V : KvPart::K;
    const MetricKind kind = MetricKind(int(actual) % 6 / 2);
    const float quantised = kind == MetricKind::Cos ? std::nanf("") : p.quantFloor(part, kind, layer, token);
    if (!std::isnan(quantised) && !std::isnan(base))
        return std::max(base, quantised);
    return base;
}

namespace {

float ratioTo(float actual, float floor)
{
    if (std::isnan(actual) || std::isnan(floor))
        return std::nanf("");
    return float(double(actual) / std::max(double(floor), 1e-10));
}

}  // namespace

float headErrorRatio(const PromptAnalysis& p, Metric actual, int layer, std::int64_t token, int head)
{
    return ratioTo(p.value(actual, layer, token, head), noiseFloor(p, actual, layer, token));
}

HeadReduction errorRatio(const PromptAnalysis& p, Metric actual, int layer, std::int64_t token)
{
    const HeadReduction worst = maxOverHeads(p, actual, layer, token);
    const float ratio = ratioTo(worst.value, noiseFloor(p, actual, layer, token));
    return std::isnan(ratio) ? HeadReduction{} : HeadReduction{ratio, worst.head};
}

float meanErrorRatio(const PromptAnalysis& p, Metric actual, int layer, std::int64_t token)
{
    return ratioTo(meanOverHeads(p, actual, layer, token), noiseFloor(p, actual, layer, token));
}

Extreme layerMax(const PromptAnalysis& p, Metric m, int layer)
{
    Extreme e;
    for (std::int64_t t = 0; t < p.tokens; ++t) {
        const HeadReduction r = maxOverHeads(p, m, layer, t);
        if (r.head >= 0 && (e.head < 0 || r.value > e.value))
            e = {r.value, layer, t, r.head};
    }
    return e;
}

Extreme layerMinBcVsNoise(const PromptAnalysis& p, KvPart part, int layer)
{
    Extreme e;
    for (std::int64_t t = 0; t < p.tokens; ++t) {
        const float v = p.bcVsNoiseValue(part, layer, t);
        if (!std::isnan(v) && (e.token < 0 || v < e.value))
            e = {v, layer, t, -1};
    }
    return e;
}

}  // namespace kvscope
