#include "format/fletcher32.h"

#include "util/simd_clones.h"

#include <algorithm>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace kvscope {

namespace {
// The words [from, n) of a run after the vector part, then the run into the sums.
void finishRun(const unsigned char* data, std::uint32_t n, std::uint32_t from, std::uint32_t total,
               std::uint32_t weighted, std::uint32_t& sum1, std::uint32_t& sum2)
{
    weighted += n * total;
    for (std::uint32_t i = from; i < n; ++i) {
        const std::uint32_t w = (std::uint32_t(data[2 * i]) << 8) | data[2 * i + 1];
        total += w;
        weighted += (n - i) * w;
    }
    sum2 += n * sum1 + weighted;
    sum1 += total;
}

// One run of n <= 360 words: HDF5 adds word by word (sum1 += w; sum2 += sum1). The same sums
// in closed form, sum2 += n * sum1 + sum (n - i) * w_i, computed 8 words at a time with adds
// only: lane j of vector k holds word 8k + j; `plain` sums the vectors, `prefix` the running
// sums before each one, so sum k * v_k = (groups - 1) * plain - prefix. uint32 arithmetic wraps
// exactly as HDF5's does, so the result is the same bits.
KVSCOPE_VECTOR_CLONES
void addRun(const unsigned char* data, std::uint32_t n, std::uint32_t& sum1, std::uint32_t& sum2)
{
    const std::uint32_t groups = n / 8;
    std::uint32_t plain[8] = {}, prefix[8] = {};
    for (std::uint32_t k = 0; k < groups; ++k) {
        const unsigned char* v = data + 16 * std::size_t(k);
        for (int j = 0; j < 8; ++j) {
            prefix[j] += plain[j];
            plain[j] += (std::uint32_t(v[2 * j]) << 8) | v[2 * j + 1];
        }
    }
    std::uint32_t total = 0, weighted = 0;  // sum w_i and sum (n - i) * w_i over the groups
    for (int j = 0; j < 8; ++j) {
        total += plain[j];
        const std::uint32_t byGroup = (groups ? groups - 1 : 0) * plain[j] - prefix[j];  // sum k * v_kj
        weighted -= 8 * byGroup + std::uint32_t(j) * plain[j];
    }
    finishRun(data, n, 8 * groups, total, weighted, sum1, sum2);
}

#if defined(__x86_64__)
// addRun with AVX2, 16 words at a time: the bytes of each word swapped into place, then
// widened to 32 bits in two vectors (per 128-bit half: words 0-3 and 4-7 of that half). The
// same closed form, with lane l of `low` holding word kLowWord[l] of each group of 16.
__attribute__((target("avx2"))) void addRunAvx2(const unsigned char* data, std::uint32_t n, std::uint32_t& sum1,
                                                std::uint32_t& sum2)
{
    static constexpr std::uint32_t kLowWord[8] = {0, 1, 2, 3, 8, 9, 10, 11};
    static constexpr std::uint32_t kHighWord[8] = {4, 5, 6, 7, 12, 13, 14, 15};
    const std::uint32_t groups = n / 16;
    const __m256i swap = _mm256_setr_epi8(1, 0, 3, 2, 5, 4, 7, 6, 9, 8, 11, 10, 13, 12, 15, 14, 1, 0, 3, 2, 5, 4, 7, 6, 9,
                                          8, 11, 10, 13, 12, 15, 14);
    const __m256i zero = _mm256_setzero_si256();
    __m256i plainLow = zero, plainHigh = zero, prefixLow = zero, prefixHigh = zero;
    for (std::uint32_t k = 0; k < groups; ++k) {
        const __m256i words = _mm256_shuffle_epi8(
            _mm256_loadu_si256(reinterpret_cast<const __m256i*>(data + 32 * std::size_t(k))), swap);
        prefixLow = _mm256_add_epi32(prefixLow, plainLow);
        prefixHigh = _mm256_add_epi32(prefixHigh, plainHigh);
        plainLow = _mm256_add_epi32(plainLow, _mm256_unpacklo_epi16(words, zero));
        plainHigh = _mm256_add_epi32(plainHigh, _mm256_unpackhi_epi16(words, zero));
    }
    alignas(32) std::uint32_t plain[2][8], prefix[2][8];
    _mm256_store_si256(reinterpret_cast<__m256i*>(plain[0]), plainLow);
    _mm256_store_si256(reinterpret_cast<__m256i*>(plain[1]), plainHigh);
    _mm256_store_si256(reinterpret_cast<__m256i*>(prefix[0]), prefixLow);
    _mm256_store_si256(reinterpret_cast<__m256i*>(prefix[1]), prefixHigh);
    std::uint32_t total = 0, weighted = 0;  // sum w_i and sum (n - i) * w_i over the groups
    for (int half = 0; half < 2; ++half)
        for (int l = 0; l < 8; ++l) {
            const std::uint32_t p = plain[half][l], word = (half ? kHighWord : kLowWord)[l];
            total += p;
            const std::uint32_t byGroup = (groups ? groups - 1 : 0) * p - prefix[half][l];  // sum k * v_k
            weighted -= 16 * byGroup + word * p;
        }
    finishRun(data, n, 16 * groups, total, weighted, sum1, sum2);
}
#endif

using AddRunFn = void (*)(const unsigned char*, std::uint32_t, std::uint32_t&, std::uint32_t&);

AddRunFn chooseAddRun()
{
#if defined(__x86_64__)
    if (useAvx2())
        return addRunAvx2;
#endif
    return addRun;
}

std::uint32_t fold(std::uint32_t s) { return (s & 0xffff) + (s >> 16); }
}  // namespace

void Fletcher32Sum::add(const unsigned char* data, std::size_t bytes)
{
    static const AddRunFn addRunVector = chooseAddRun();
    // HDF5 folds the sums after every 360 words of the whole; a piece ends a run anywhere
    // (the run's sums are word by word, so adding it in parts gives the same bits).
    for (std::size_t words = bytes / 2; words;) {
        const std::uint32_t n = std::uint32_t(std::min<std::size_t>(words, 360 - m_inRun));
        addRunVector(data, n, m_sum1, m_sum2);
        data += 2 * std::size_t(n);
        words -= n;
        if ((m_inRun += n) == 360) {
            m_sum1 = fold(m_sum1);
            m_sum2 = fold(m_sum2);
            m_inRun = 0;
        }
    }
}

std::uint32_t Fletcher32Sum::finish(const unsigned char* oddByte)
{
    if (m_inRun) {
        m_sum1 = fold(m_sum1);
        m_sum2 = fold(m_sum2);
        m_inRun = 0;
    }
    if (oddByte) {
        m_sum1 += std::uint32_t(*oddByte) << 8;
        m_sum2 += m_sum1;
        m_sum1 = fold(m_sum1);
        m_sum2 = fold(m_sum2);
    }
    m_sum1 = fold(m_sum1);
    m_sum2 = fold(m_sum2);
    return (m_sum2 << 16) | m_sum1;
}

std::uint32_t fletcher32(const unsigned char* data, std::size_t bytes)
{
    Fletcher32Sum sum;
    sum.add(data, bytes - bytes % 2);
    return sum.finish(bytes % 2 ? data + bytes - 1 : nullptr);
}

std::uint32_t storedFletcher32(const unsigned char* stored)
{
    return std::uint32_t(stored[0]) | std::uint32_t(stored[1]) << 8 | std::uint32_t(stored[2]) << 16 |
           std::uint32_t(stored[3]) << 24;
}

bool fletcher32Matches(const unsigned char* data, std::size_t bytes, const unsigned char* stored)
{
    return storedFletcher32(stored) == fletcher32(data, bytes);
}

}  // namespace kvscope
