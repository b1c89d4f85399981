#include "metrics/error_histogram.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <vector>

namespace kvscope {

namespace {

// Counts of `values` on `edges` (bin i: [edges[i], edges[i+1]), the last bin closed); values
// outside are returned as the count apart.
std::int64_t countInto(const std::vector<float>& values, const std::vector<double>& edges, bool logarithmic,
                       std::vector<double>& counts)
{
    const int bins = int(edges.size()) - 1;
    counts.assign(std::size_t(bins), 0.0);
    const double lo = logarithmic ? std::log(edges.front()) : edges.front();
    const double hi = logarithmic ? std::log(edges.back()) : edges.back();
    const double scale = hi > lo ? bins / (hi - lo) : 0;
    std::int64_t apart = 0;
    for (float raw : values) {
        const double v = raw;
        if (!(v >= edges.front() && v <= edges.back())) {
            ++apart;
            continue;
        }
        int bin = int(((logarithmic ? std::log(v) : v) - lo) * scale);
        bin = std::clamp(bin, 0, bins - 1);
        counts[std::size_t(bin)] += 1;
    }
    return apart;
}

}  // namespace

DisplayBins logDisplayBins(const std::vector<float>& base, const std::vector<float>& actual, int bins)
{
    DisplayBins out;
    out.logarithmic = true;
    double lo = std::numeric_limits<double>::infinity(), hi = 0;
    for (const std::vector<float>* set : {&base, &actual})
        for (float v : *set)
            if (v > 0 && std::isfinite(v)) {
                lo = std::min(lo, double(v));
                hi = std::max(hi, double(v));
            }
    if (!(hi > 0))
        return out;  // no positive error: nothing to draw on a log axis
    if (hi <= lo)
        lo = hi / 2, hi *= 2;
    for (int i = 0; i <= bins; ++i)
        out.edges.push_back(lo * std::pow(hi / lo, double(i) / bins));
    out.edges.front() = lo, out.edges.back() = hi;  // exactly, whatever pow rounds to
    out.actualApart = countInto(actual, out.edges, true, out.actual);
    if (!base.empty())
        out.baseApart = countInto(base, out.edges, true, out.base);
    return out;
}

DisplayBins linearDisplayBins(const std::vector<float>& base, const std::vector<float>& actual, int bins)
{
    DisplayBins out;
    std::vector<float> all;
    all.reserve(base.size() + actual.size());
    for (const std::vector<float>* set : {&base, &actual})
        for (float v : *set)
            if (std::isfinite(v))
                all.push_back(v);
    if (all.empty())
        return out;
    const std::size_t k = std::min(all.size() - 1, std::size_t(0.99 * double(all.size())));
    std::nth_element(all.begin(), all.begin() + std::ptrdiff_t(k), all.end());
    double hi = all[k];
    if (!(hi > 0))
        hi = *std::max_element(all.begin(), all.end());
    if (!(hi > 0))
        hi = 1;  // every error is 0: one bar at 0
    for (int i = 0; i <= bins; ++i)
        out.edges.push_back(hi * i / bins);
    out.actualApart = countInto(actual, out.edges, false, out.actual);
    if (!base.empty())
        out.baseApart = countInto(base, out.edges, false, out.base);
    return out;
}

HeadErrorHistogram headErrorHistogram(const CaptureLoader& loader, const std::string& promptId,
                                      const std::string& layer, int head, KvPart part, std::int64_t tokenBegin,
                                      std::int64_t tokenEnd, int bins)
{
    const PromptInfo& info = loader.reader().prompt(promptId);
    const bool threeWay = info.hasBaseline;
    const LayerKv actual = loader.engineLayer(promptId, layer);
    const LayerKv reference = loader.referenceLayer(promptId, threeWay ? ReferenceRole::Baseline : ReferenceRole::Expected, layer);
    std::optional<LayerKv> base;
    if (threeWay)
        base = loader.referenceLayer(promptId, ReferenceRole::Expected, layer);
    if (head < 0 || head >= reference.heads)
        throw std::invalid_argument("head " + std::to_string(head) + " outside [0, " + std::to_string(reference.heads) + ")");
    if (tokenBegin < 0 || tokenEnd > reference.seq || tokenBegin >= tokenEnd)
        throw std::invalid_argument("token range [" + std::to_string(tokenBegin) + ", " + std::to_string(tokenEnd) +
                                    ") outside [0, " + std::to_string(reference.seq) + ")");

    auto at = [&](const LayerKv& kv, std::int64_t t) { return part == KvPart::K ? kv.kAt(head, t) : kv.vAt(head, t); };
    auto held = [&](std::int64_t t) {
        return reference.present[std::size_t(t)] && actual.present[std::size_t(t)] &&
               (!base || base->present[std::size_t(t)]);
    };
    ErrorRange range;  // of the float32 errors, as they are binned
    HeadErrorHistogram out;
    for (std::int64_t t = tokenBegin; t < tokenEnd; ++t) {
        if (!held(t))
            continue;
        ++out.tokensUsed;
        for (int d = 0; d < reference.headDim; ++d) {
            range.add(std::fabs(at(reference, t)[d] - at(actual, t)[d]));
            if (base)
                range.add(std::fabs(at(reference, t)[d] - at(*base, t)[d]));
        }
    }
    const SharedBins shared(range, bins);
    out.lo = shared.lo();
    out.hi = shared.hi();
    out.bins = bins;
    out.actual = Histogram(bins);
    if (base)
        out.base = Histogram(bins);
    std::vector<float> actualErrors, baseErrors;
    for (std::int64_t t = tokenBegin; t < tokenEnd; ++t) {
        if (!held(t))
            continue;
        for (int d = 0; d < reference.headDim; ++d) {
            actualErrors.push_back(std::fabs(at(reference, t)[d] - at(actual, t)[d]));
            if (base)
                baseErrors.push_back(std::fabs(at(reference, t)[d] - at(*base, t)[d]));
        }
    }
    shared.add(actualErrors.data(), actualErrors.size(), out.actual);
    if (base)
        shared.add(baseErrors.data(), baseErrors.size(), *out.base);
    if (base && out.tokensUsed > 0)
        out.bc = float(bhattacharyya(*out.base, out.actual));
    out.logBins = logDisplayBins(baseErrors, actualErrors);
    out.linearBins = linearDisplayBins(baseErrors, actualErrors);
    return out;
}

}  // namespace kvscope
