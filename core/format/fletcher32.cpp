#include "format/fletcher32.h"

#include "util/simd_clones.h"

namespace kvscope {

namespace {
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
    weighted += n * total;
    for (std::uint32_t i = 8 * groups; i < n; ++i) {  // the last words of a short run
        const std::uint32_t w = (std::uint32_t(data[2 * i]) << 8) | data[2 * i + 1];
        total += w;
        weighted += (n - i) * w;
    }
    sum2 += n * sum1 + weighted;
    sum1 += total;
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
