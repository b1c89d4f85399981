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

HeadErrorHistogram errorHistogram(const std::vector<float>* baseErrors, const std::vector<float>& actualErrors,
                                  std::int64_t tokens, int bins)
{
    static const std::vector<float> none;
    const std::vector<float>& base = baseErrors ? *baseErrors : none;
    ErrorRange range;  // of the float32 errors, as they are binned
    for (const std::vector<float>* errors : {&actualErrors, &base})
        for (float e : *errors)
            range.add(e);
    const SharedBins shared(range, bins);
    HeadErrorHistogram out;
    out.tokensUsed = tokens;
    out.lo = shared.lo();
    out.hi = shared.hi();
    out.bins = bins;
    out.actual = Histogram(bins);
    shared.add(actualErrors.data(), actualErrors.size(), out.actual);
    if (baseErrors) {
        out.base = Histogram(bins);
        shared.add(base.data(), base.size(), *out.base);
        if (tokens > 0)
            out.bc = float(bhattacharyya(*out.base, out.actual));
    }
    out.logBins = logDisplayBins(base, actualErrors);
    out.linearBins = linearDisplayBins(base, actualErrors);
    return out;
}

}  // namespace kvscope
