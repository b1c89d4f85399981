#include "metrics/bc_vs_noise.h"

#include "util/simd_clones.h"

#include <algorithm>
#include <cmath>

namespace kvscope {

namespace {

// The bins of `count` errors (NaN gives a bin >= kLogBins), and their smallest and largest.
KVSCOPE_VECTOR_CLONES
void binsOf(const float* errors, std::size_t count, std::uint16_t* bins, std::uint32_t& lo, std::uint32_t& hi)
{
    std::uint32_t l = 0xffffffffu, h = 0;
#pragma omp simd reduction(min : l) reduction(max : h)
    for (std::size_t i = 0; i < count; ++i) {
        const std::uint32_t b = (std::bit_cast<std::uint32_t>(errors[i]) & 0x7fffffffu) >> 20;
        bins[i] = std::uint16_t(b);
        l = b < l ? b : l;
        h = b > h ? b : h;
    }
    lo = l;
    hi = h;
}

// counts[b] += the four lanes' counts of bin b, for b in [from, to].
KVSCOPE_VECTOR_CLONES
void addLanes(std::uint32_t* const lane[4], std::uint32_t from, std::uint32_t to, std::uint32_t* counts)
{
    const std::uint32_t *l0 = lane[0], *l1 = lane[1], *l2 = lane[2], *l3 = lane[3];
#pragma omp simd
    for (std::uint32_t b = from; b <= to; ++b)
        counts[b] += l0[b] + l1[b] + l2[b] + l3[b];
}

}  // namespace

void LogHistogram::add(const float* errors, std::size_t count, LogHistogram* total)
{
    if (count == 0)
        return;
    if (counts.empty())
        counts.assign(kLogBins, 0);
    if (total && total->counts.empty())
        total->counts.assign(kLogBins, 0);
    thread_local std::vector<std::uint16_t> bins;
    bins.resize(count);
    std::uint32_t lo = 0, hi = 0;
    binsOf(errors, count, bins.data(), lo, hi);
    // Four counters per bin break the store-to-load chains of repeated bins (errors of one
    // token crowd into a few octaves); NaN lands past kLogBins and is dropped below.
    constexpr std::size_t kLanes = 4, kSpan = 2048;
    thread_local std::vector<std::uint32_t> lanes(kLanes * kSpan, 0);
    std::uint32_t* lane[kLanes] = {lanes.data(), lanes.data() + kSpan, lanes.data() + 2 * kSpan, lanes.data() + 3 * kSpan};
    std::size_t i = 0;
    for (; i + kLanes <= count; i += kLanes)
        for (std::size_t k = 0; k < kLanes; ++k)
            ++lane[k][bins[i + k]];
    for (; i < count; ++i)
        ++lane[0][bins[i]];
    // Fold the lanes into the counts over the bins the values touched (vectorised; an
    // untouched bin adds 0). lo is a touched bin; so is hi unless it is NaN's (past the last
    // bin), and then the last touched bin below it is searched for.
    const std::uint32_t top = std::min<std::uint32_t>(hi, kLogBins - 1);
    if (lo <= top) {
        addLanes(lane, lo, top, counts.data());
        std::uint32_t highest = top;
        if (hi != top)
            while (highest > lo && lane[0][highest] + lane[1][highest] + lane[2][highest] + lane[3][highest] == 0)
                --highest;
        first = std::min(first, int(lo));
        last = std::max(last, int(highest));
        if (total) {
            addLanes(lane, lo, top, total->counts.data());
            total->first = std::min(total->first, int(lo));
            total->last = std::max(total->last, int(highest));
        }
    }
    for (std::size_t k = 0; k < kLanes; ++k)
        std::fill(lane[k] + lo, lane[k] + hi + 1, 0u);
}

void LogHistogram::merge(const LogHistogram& other)
{
    if (other.last < 0)
        return;
    if (counts.empty())
        counts.assign(kLogBins, 0);
    for (int i = other.first; i <= other.last; ++i)
        counts[std::size_t(i)] += other.counts[std::size_t(i)];
    first = std::min(first, other.first);
    last = std::max(last, other.last);
}

void LogHistogram::merge(int from, const std::uint32_t* values, std::size_t size)
{
    if (size == 0)
        return;
    if (counts.empty())
        counts.assign(kLogBins, 0);
    for (std::size_t i = 0; i < size; ++i)
        counts[std::size_t(from) + i] += values[i];
    first = std::min(first, from);
    last = std::max(last, from + int(size) - 1);
}

void LogHistogram::clear()
{
    for (int i = first; i <= last; ++i)
        counts[std::size_t(i)] = 0;
    first = kLogBins;
    last = -1;
}

namespace {

// The sum of sqrt(base * actual) over `count` bins, in four running sums (bin i into sum i mod 4)
// added in order at the end: correctly rounded products and square roots added in a fixed
// order, so the same bits on every CPU and vector width, with no chain of additions a bin long
// (a token's counts, below 2^26, multiply exactly).
KVSCOPE_VECTOR_CLONES
double sqrtProductSum(const std::uint32_t* base, const std::uint32_t* actual, int count)
{
    double sums[4] = {0, 0, 0, 0};
    int i = 0;
    for (; i + 4 <= count; i += 4)
#pragma omp simd
        for (int k = 0; k < 4; ++k)
            sums[k] += std::sqrt(double(base[i + k]) * double(actual[i + k]));
    for (; i < count; ++i)
        sums[0] += std::sqrt(double(base[i]) * double(actual[i]));
    return ((sums[0] + sums[1]) + sums[2]) + sums[3];
}

std::uint64_t total(const LogHistogram& h)
{
    std::uint64_t n = 0;
    for (int i = h.first; i <= h.last; ++i)
        n += h.counts[std::size_t(i)];
    return n;
}

}  // namespace

double bcVsNoise(const LogHistogram& base, const LogHistogram& actual)
{
    // Integer totals: the same value as summing the counts in double (all exact below 2^53).
    const double nBase = double(total(base)), nActual = double(total(actual));
    if (nBase == 0 || nActual == 0)
        return std::nan("");
    const int first = std::max(base.first, actual.first), last = std::min(base.last, actual.last);
    if (first > last)
        return 0.0;
    // sum sqrt(p q) = sum sqrt(base actual) / sqrt(nBase nActual): a bin empty on either side
    // adds +0, which changes no sum, so every bin both touched ranges share is summed alike.
    const double sum = sqrtProductSum(base.counts.data() + first, actual.counts.data() + first, last - first + 1);
    return std::clamp(sum / std::sqrt(nBase * nActual), 0.0, 1.0);
}

}  // namespace kvscope
