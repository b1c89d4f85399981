#include "metrics/bhattacharyya.h"

#include "util/simd_clones.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <vector>

#if defined(__x86_64__)
#include <immintrin.h>
#elif defined(__SSE2__)
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
    m_step = (m_hi - m_lo) / bins;
}

namespace {

// Pass 1 of SharedBins::add for values [i, n): the bin in float arithmetic. Its rounding
// error is below 1e-5 of a bin, so wherever the position within the bin is more than 1e-4
// from either edge, the float bin is the exact one; v == lo (t == 0 exactly) and v == hi
// are exact too. The rest (near an edge, NaN, outside the range) gets `undecidedBin`, to be
// decided exactly. Returns where it stopped (a multiple of the vector width).
struct EstimateParams {
    float lo, scale, bins, hi;
    std::int32_t lastBin, undecidedBin;
};

#if defined(__x86_64__)
__attribute__((target("avx2"))) std::size_t estimateAvx2(const float* v, std::size_t n, std::int32_t* out,
                                                         const EstimateParams& p)
{
    const __m256 lo = _mm256_set1_ps(p.lo), scale = _mm256_set1_ps(p.scale), bins = _mm256_set1_ps(p.bins);
    const __m256 hi = _mm256_set1_ps(p.hi), zero = _mm256_setzero_ps();
    const __m256 low = _mm256_set1_ps(1e-4f), high = _mm256_set1_ps(1.0f - 1e-4f);
    const __m256i lastBin = _mm256_set1_epi32(p.lastBin), undecided = _mm256_set1_epi32(p.undecidedBin);
    std::size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 x = _mm256_loadu_ps(v + i);
        __m256 t = _mm256_mul_ps(_mm256_sub_ps(x, lo), scale);
        const __m256 inside = _mm256_and_ps(_mm256_cmp_ps(t, zero, _CMP_GE_OQ), _mm256_cmp_ps(t, bins, _CMP_LT_OQ));
        t = _mm256_and_ps(t, inside);
        const __m256i k = _mm256_cvttps_epi32(t);
        const __m256 frac = _mm256_sub_ps(t, _mm256_cvtepi32_ps(k));
        const __m256 top = _mm256_cmp_ps(x, hi, _CMP_EQ_OQ);
        const __m256 clear = _mm256_and_ps(
            inside, _mm256_or_ps(_mm256_cmp_ps(t, zero, _CMP_EQ_OQ),
                                 _mm256_and_ps(_mm256_cmp_ps(frac, low, _CMP_GT_OQ), _mm256_cmp_ps(frac, high, _CMP_LT_OQ))));
        __m256i bin = _mm256_blendv_epi8(undecided, k, _mm256_castps_si256(clear));
        bin = _mm256_blendv_epi8(bin, lastBin, _mm256_castps_si256(top));
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i), bin);
    }
    return i;
}
// The same on sixteen values at a time. (GCC 12 takes the conversions' deliberately undefined
// pass-through operand for an uninitialised variable.)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
__attribute__((target("avx512f"))) std::size_t estimateAvx512(const float* v, std::size_t n, std::int32_t* out,
                                                             const EstimateParams& p)
{
    const __m512 lo = _mm512_set1_ps(p.lo), scale = _mm512_set1_ps(p.scale), bins = _mm512_set1_ps(p.bins);
    const __m512 hi = _mm512_set1_ps(p.hi), zero = _mm512_setzero_ps();
    const __m512 low = _mm512_set1_ps(1e-4f), high = _mm512_set1_ps(1.0f - 1e-4f);
    const __m512i lastBin = _mm512_set1_epi32(p.lastBin), undecided = _mm512_set1_epi32(p.undecidedBin);
    std::size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        const __m512 x = _mm512_loadu_ps(v + i);
        __m512 t = _mm512_mul_ps(_mm512_sub_ps(x, lo), scale);
        const __mmask16 inside = _mm512_mask_cmp_ps_mask(_mm512_cmp_ps_mask(t, zero, _CMP_GE_OQ), t, bins, _CMP_LT_OQ);
        t = _mm512_maskz_mov_ps(inside, t);
        const __m512i k = _mm512_cvttps_epi32(t);
        const __m512 frac = _mm512_sub_ps(t, _mm512_cvtepi32_ps(k));
        const __mmask16 away = _mm512_mask_cmp_ps_mask(_mm512_cmp_ps_mask(frac, low, _CMP_GT_OQ), frac, high, _CMP_LT_OQ);
        const __mmask16 clear = inside & (_mm512_cmp_ps_mask(t, zero, _CMP_EQ_OQ) | away);
        const __m512i bin = _mm512_mask_blend_epi32(clear, undecided, k);
        _mm512_storeu_si512(out + i, _mm512_mask_blend_epi32(_mm512_cmp_ps_mask(x, hi, _CMP_EQ_OQ), bin, lastBin));
    }
    return i;
}
#pragma GCC diagnostic pop
#endif

std::size_t estimateSse2(const float* v, std::size_t n, std::int32_t* out, const EstimateParams& p)
{
    std::size_t i = 0;
#if defined(__SSE2__)
    const __m128 lo = _mm_set1_ps(p.lo), scale = _mm_set1_ps(p.scale), bins = _mm_set1_ps(p.bins);
    const __m128 hi = _mm_set1_ps(p.hi), zero = _mm_setzero_ps();
    const __m128 low = _mm_set1_ps(1e-4f), high = _mm_set1_ps(1.0f - 1e-4f);
    const __m128i lastBin = _mm_set1_epi32(p.lastBin), undecided = _mm_set1_epi32(p.undecidedBin);
    auto select = [](__m128i mask, __m128i a, __m128i b) {  // mask ? a : b
        return _mm_or_si128(_mm_and_si128(mask, a), _mm_andnot_si128(mask, b));
    };
    for (; i + 4 <= n; i += 4) {
        const __m128 x = _mm_loadu_ps(v + i);
        __m128 t = _mm_mul_ps(_mm_sub_ps(x, lo), scale);
        const __m128 inside = _mm_and_ps(_mm_cmpge_ps(t, zero), _mm_cmplt_ps(t, bins));  // false for NaN
        t = _mm_and_ps(t, inside);
        const __m128i k = _mm_cvttps_epi32(t);
        const __m128 frac = _mm_sub_ps(t, _mm_cvtepi32_ps(k));
        const __m128 top = _mm_cmpeq_ps(x, hi);
        const __m128 clear =
            _mm_and_ps(inside, _mm_or_ps(_mm_cmpeq_ps(t, zero), _mm_and_ps(_mm_cmpgt_ps(frac, low), _mm_cmplt_ps(frac, high))));
        const __m128i bin = select(_mm_castps_si128(clear), k, undecided);
        _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), select(_mm_castps_si128(top), lastBin, bin));
    }
#endif
    return i;
}

using EstimateFn = std::size_t (*)(const float*, std::size_t, std::int32_t*, const EstimateParams&);

EstimateFn chooseEstimate()
{
#if defined(__x86_64__)
    return pickBySimdLevel<EstimateFn>(estimateAvx512, estimateAvx2, estimateSse2);
#else
    return estimateSse2;
#endif
}

}  // namespace

void SharedBins::add(const float* values, std::size_t count, std::uint64_t* counts) const
{
    static const EstimateFn estimateVector = chooseEstimate();
    // Four counters per bin, one row per lane, break the store-to-load chains of repeated
    // bins (most errors fall into the first few bins); column m_bins collects the values
    // whose bin is decided exactly afterwards.
    // (On the stack for the usual bin counts: this runs a few times per token.)
    constexpr std::size_t kLanes = 4, kStackBins = 128;
    const std::size_t stride = std::size_t(m_bins) + 1;
    std::uint32_t stackLanes[kLanes * (kStackBins + 1)];
    thread_local std::vector<std::uint32_t> heapLanes;
    std::uint32_t* lanes = stackLanes;
    if (std::size_t(m_bins) > kStackBins) {
        heapLanes.resize(kLanes * stride);
        lanes = heapLanes.data();
    }
    std::fill_n(lanes, kLanes * stride, 0u);
    std::uint32_t* lane[kLanes] = {lanes, lanes + stride, lanes + 2 * stride, lanes + 3 * stride};
    const EstimateParams params{float(m_lo), float(m_scale), float(m_bins), float(m_hi), m_bins - 1, m_bins};
    constexpr std::size_t kChunk = 256;
    std::int32_t estimate[kChunk];
    for (std::size_t begin = 0; begin < count; begin += kChunk) {
        const std::size_t n = std::min(kChunk, count - begin);
        const float* chunk = values + begin;
        // Pass 1, vectorised (see estimateSse2), with a scalar tail.
        for (std::size_t i = estimateVector(chunk, n, estimate, params); i < n; ++i) {
            const float t = (chunk[i] - params.lo) * params.scale;
            const bool inside = t >= 0.0f && t < params.bins;
            const std::int32_t k = inside ? std::int32_t(t) : 0;
            const float frac = t - float(k);
            estimate[i] = chunk[i] == params.hi ? params.lastBin
                        : inside && (t == 0.0f || (frac > 1e-4f && frac < 1.0f - 1e-4f)) ? k : m_bins;
        }
        // Pass 2: count, unrolled over the lanes.
        std::size_t i = 0;
        for (; i + kLanes <= n; i += kLanes) {
            ++lane[0][estimate[i]];
            ++lane[1][estimate[i + 1]];
            ++lane[2][estimate[i + 2]];
            ++lane[3][estimate[i + 3]];
        }
        for (; i < n; ++i)
            ++lane[0][estimate[i]];
        // Pass 3: the undecided values (rare), exactly.
        const std::uint32_t undecided = lane[0][m_bins] + lane[1][m_bins] + lane[2][m_bins] + lane[3][m_bins];
        if (undecided == 0)
            continue;
        lane[0][m_bins] = lane[1][m_bins] = lane[2][m_bins] = lane[3][m_bins] = 0;
        constexpr std::size_t kBlock = 16;  // looked for a vector at a time
        for (std::size_t block = 0; block < n; block += kBlock) {
            const std::size_t end = std::min(n, block + kBlock);
            bool any = false;
            for (std::size_t j = block; j < end; ++j)
                any |= estimate[j] == m_bins;
            for (std::size_t j = block; any && j < end; ++j)
                if (estimate[j] == m_bins)
                    if (const int k = binOf(chunk[j]); k >= 0)
                        ++lane[0][k];
        }
    }
    for (std::size_t b = 0; b < std::size_t(m_bins); ++b)
        counts[b] += std::uint64_t(lane[0][b]) + lane[1][b] + lane[2][b] + lane[3][b];
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

namespace {

// sqrt((p / sp) * (q / sq)) of every bin, element by element (vectorised: each lane rounds as
// the scalar expression does, so the terms are the same bits).
KVSCOPE_VECTOR_CLONES
void bcTerms(const double* p, const double* q, int bins, double sp, double sq, double* terms)
{
#pragma omp simd
    for (int i = 0; i < bins; ++i)
        terms[i] = std::sqrt((p[i] / sp) * (q[i] / sq));
}

}  // namespace

double bhattacharyya(const std::uint64_t* p, const std::uint64_t* q, int bins)
{
    // The totals, and as doubles (exact below 2^53; x86 has no vector conversion from 64-bit
    // integers before AVX-512) the counts of the bins counted on both sides: a bin empty on
    // either side adds +0, which changes no sum, so only these are summed.
    thread_local std::vector<double> buffer;
    buffer.resize(std::size_t(bins) * 3);
    double* dp = buffer.data();
    double* dq = dp + bins;
    double* terms = dq + bins;
    std::uint64_t np = 0, nq = 0;
    int both = 0;
    for (int i = 0; i < bins; ++i) {
        np += p[i], nq += q[i];
        dp[both] = double(p[i]);
        dq[both] = double(q[i]);
        both += p[i] != 0 && q[i] != 0;
    }
    // The same value as summing the counts in double.
    const double sp = double(np) + 1e-10, sq = double(nq) + 1e-10;
    bcTerms(dp, dq, both, sp, sq, terms);
    // Summed in bin order.
    double bc = 0;
    for (int i = 0; i < both; ++i)
        bc += terms[std::size_t(i)];
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
