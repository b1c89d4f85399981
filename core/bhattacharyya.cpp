#include "bhattacharyya.h"

#include <algorithm>
#include <array>
#include <cmath>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace kvscope {

SharedBins::SharedBins(ErrorRange range, int bins)
    : m_bins(bins)
    , m_lo(range.lo)
    , m_hi(range.hi)
{
    if (range.empty()) {
        m_lo = 0;
        m_hi = 1;
    } else if (m_lo == m_hi) {
        m_lo -= 0.5;
        m_hi += 0.5;
    }
    m_scale = bins / (m_hi - m_lo);
    // numpy.linspace: i * step + start, the last edge exactly `stop`.
    const double step = (m_hi - m_lo) / bins;
    for (int i = 0; i < bins; ++i)
        m_edges.push_back(double(i) * step + m_lo);
    m_edges.push_back(m_hi);
}

void SharedBins::add(const float* values, std::size_t count, std::uint64_t* counts) const
{
    // Eight interleaved counters per bin break the store-to-load chains of repeated bins
    // (most errors fall into the first few bins).
    constexpr std::size_t kLanes = 8;
    thread_local std::vector<std::uint32_t> lanes;
    lanes.assign(kLanes * std::size_t(m_bins), 0);
    const float lo = float(m_lo), scale = float(m_scale), bins = float(m_bins);
    constexpr std::size_t kChunk = 256;
    std::int32_t estimate[kChunk];
    for (std::size_t begin = 0; begin < count; begin += kChunk) {
        const std::size_t n = std::min(kChunk, count - begin);
        const float* chunk = values + begin;
        // Pass 1, vectorised: the bin in float arithmetic. Its rounding error is below 1e-5
        // of a bin, so wherever the position within the bin is more than 1e-4 from either
        // edge, the float bin is the exact one. The rest (near an edge, the top edge, NaN,
        // outside the range) is marked -1 and decided exactly by binOf in pass 2.
        std::size_t i = 0;
#if defined(__SSE2__)
        const __m128 lo4 = _mm_set1_ps(lo), scale4 = _mm_set1_ps(scale), bins4 = _mm_set1_ps(bins);
        const __m128 zero = _mm_setzero_ps(), low = _mm_set1_ps(1e-4f), high = _mm_set1_ps(1.0f - 1e-4f);
        for (; i + 4 <= n; i += 4) {
            __m128 t = _mm_mul_ps(_mm_sub_ps(_mm_loadu_ps(chunk + i), lo4), scale4);
            const __m128 inside = _mm_and_ps(_mm_cmpge_ps(t, zero), _mm_cmplt_ps(t, bins4));  // false for NaN
            t = _mm_and_ps(t, inside);
            const __m128i k = _mm_cvttps_epi32(t);
            const __m128 frac = _mm_sub_ps(t, _mm_cvtepi32_ps(k));
            const __m128i clear = _mm_castps_si128(
                _mm_and_ps(inside, _mm_and_ps(_mm_cmpgt_ps(frac, low), _mm_cmplt_ps(frac, high))));
            const __m128i marked = _mm_or_si128(_mm_and_si128(clear, k), _mm_andnot_si128(clear, _mm_set1_epi32(-1)));
            _mm_storeu_si128(reinterpret_cast<__m128i*>(estimate + i), marked);
        }
#endif
        for (; i < n; ++i) {
            const float t = (chunk[i] - lo) * scale;
            const bool inside = t >= 0.0f && t < bins;
            const std::int32_t k = inside ? std::int32_t(t) : 0;
            const float frac = t - float(k);
            estimate[i] = inside && frac > 1e-4f && frac < 1.0f - 1e-4f ? k : -1;
        }
        // Pass 2: count.
        for (std::size_t i = 0; i < n; ++i) {
            int k = estimate[i];
            if (k < 0 && (k = binOf(chunk[i])) < 0)
                continue;
            ++lanes[std::size_t(k) * kLanes + (i & (kLanes - 1))];
        }
    }
    for (std::size_t b = 0; b < std::size_t(m_bins); ++b)
        for (std::size_t lane = 0; lane < kLanes; ++lane)
            counts[b] += lanes[b * kLanes + lane];
}

void Histogram::merge(const Histogram& other)
{
    for (std::size_t i = 0; i < counts.size(); ++i)
        counts[i] += other.counts[i];
}

std::uint64_t Histogram::total() const
{
    std::uint64_t n = 0;
    for (std::uint64_t c : counts)
        n += c;
    return n;
}

double bhattacharyya(const std::uint64_t* p, const std::uint64_t* q, int bins)
{
    double sp = 0, sq = 0;
    for (int i = 0; i < bins; ++i)
        sp += double(p[i]), sq += double(q[i]);
    sp += 1e-10;
    sq += 1e-10;
    double bc = 0;
    for (int i = 0; i < bins; ++i)
        bc += std::sqrt((double(p[i]) / sp) * (double(q[i]) / sq));
    return std::clamp(bc, 0.0, 1.0);
}

double bhattacharyyaOfSets(const std::vector<double>& a, const std::vector<double>& b)
{
    if (a.empty() || b.empty())
        return 0.0;
    ErrorRange range;
    for (double v : a)
        range.add(v);
    for (double v : b)
        range.add(v);
    const SharedBins bins(range);
    Histogram p, q;
    for (double v : a)
        if (const int bin = bins.binOf(v); bin >= 0)
            ++p.counts[std::size_t(bin)];
    for (double v : b)
        if (const int bin = bins.binOf(v); bin >= 0)
            ++q.counts[std::size_t(bin)];
    return bhattacharyya(p, q);
}

}  // namespace kvscope
