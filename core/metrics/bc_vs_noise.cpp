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

// sqrt(base / nBase * actual / nActual) of every bin, element by element (vectorised: each
// lane rounds as the scalar expression does, so the terms are the same bits).
KVSCOPE_VECTOR_CLONES
void bcTerms(const double* base, const double* actual, int count, double nBase, double nActual, double* terms)
{
#pragma omp simd
    for (int i = 0; i < count; ++i)
        terms[i] = std::sqrt(base[i] / nBase * actual[i] / nActual);
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
    // Only bins counted on both sides add to the sum (the others add +0, which changes no
    // sum): their counts as doubles, in bin order.
    thread_local std::vector<double> buffer(std::size_t(kLogBins) * 3);
    double* b = buffer.data();
    double* a = b + kLogBins;
    double* terms = a + kLogBins;
    int both = 0;
    for (int i = first; i <= last; ++i) {
        b[both] = double(base.counts[std::size_t(i)]);
        a[both] = double(actual.counts[std::size_t(i)]);
        both += base.counts[std::size_t(i)] != 0 && actual.counts[std::size_t(i)] != 0;
    }
    bcTerms(b, a, both, nBase, nActual, terms);
    double bc = 0;
    for (int i = 0; i < both; ++i)
        bc += terms[std::size_t(i)];
    return std::clamp(bc, 0.0, 1.0);
}

}  // namespace kvscope
