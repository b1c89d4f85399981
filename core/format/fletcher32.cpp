#include "format/fletcher32.h"

#include "util/simd_clones.h"

namespace kvscope {

namespace {
// One run of n <= 360 words: HDF5 adds word by word (sum1 += w; sum2 += sum1). The same
// sums in closed form, sum2 += n * sum1 + sum (n - i) * w_i, vectorise; uint32 arithmetic
// wraps exactly as HDF5's does, so every intermediate value is the same.
KVSCOPE_VECTOR_CLONES
void addRun(const unsigned char* data, std::uint32_t n, std::uint32_t& sum1, std::uint32_t& sum2)
{
    std::uint32_t plain = 0, weighted = 0;
#pragma omp simd reduction(+ : plain, weighted)
    for (std::uint32_t i = 0; i < n; ++i) {
        const std::uint32_t w = (std::uint32_t(data[2 * i]) << 8) | data[2 * i + 1];
        plain += w;
        weighted += (n - i) * w;
    }
    sum2 += n * sum1 + weighted;
    sum1 += plain;
}

std::uint32_t fold(std::uint32_t s) { return (s & 0xffff) + (s >> 16); }
}  // namespace

std::uint32_t fletcher32(const unsigned char* data, std::size_t bytes)
{
    std::size_t words = bytes / 2;
    std::uint32_t sum1 = 0, sum2 = 0;
    while (words) {
        const std::uint32_t n = words > 360 ? 360 : std::uint32_t(words);
        words -= n;
        addRun(data, n, sum1, sum2);
        data += 2 * std::size_t(n);
        sum1 = fold(sum1);
        sum2 = fold(sum2);
    }
    if (bytes % 2) {
        sum1 += std::uint32_t(*data) << 8;
        sum2 += sum1;
        sum1 = fold(sum1);
        sum2 = fold(sum2);
    }
    sum1 = fold(sum1);
    sum2 = fold(sum2);
    return (sum2 << 16) | sum1;
}

bool fletcher32Matches(const unsigned char* data, std::size_t bytes, const unsigned char* stored)
{
    const std::uint32_t sum = std::uint32_t(stored[0]) | std::uint32_t(stored[1]) << 8 |
                              std::uint32_t(stored[2]) << 16 | std::uint32_t(stored[3]) << 24;
    return sum == fletcher32(data, bytes);
}

}  // namespace kvscope
