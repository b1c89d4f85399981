#pragma once
// The Bhattacharyya coefficient against the noise floor ("bc_vs_noise"), beside the reference
// tool's BC (bhattacharyya.h), which a fault fools: its 100 bins are equal-width over [min, max]
// of both error sets, so one head's large errors stretch them, every other error lands in bin
// 0, and BC is ~1 on a real fault (and, over a whole layer, the largest dtype-noise outliers
// do the same).
//
// Here the bins are logarithmic and fixed: eight per octave of the error's magnitude, read
// from the float32 bits (exponent and top three mantissa bits), from 0 up to infinity. Errors
// of dtype noise spread over many octaves, and every octave is resolved; an actual error
// beyond the noise floor's largest lands in bins the base (expected vs baseline) never fills,
// so its whole weight leaves the sum: this is BC with an overflow bin for free.
// p = base counts / base total, q = actual counts / actual total, BC = sum sqrt(p q) in [0, 1];
// either set empty gives NaN (no data). NaN errors are skipped.
//
// The bins are the same for every token, so pooling tokens and prompts is exact in one pass:
// counts add up. The bin of a value depends only on its bits: the same on every CPU.

#include <bit>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace kvscope {

inline constexpr int kLogBins = 2041;  // bins 0 (zero) .. 2039, and 2040 for +infinity

// The bin of a non-negative error, or -1 for NaN.
inline int logBinOf(float error)
{
    const std::uint32_t bits = std::bit_cast<std::uint32_t>(error) & 0x7fffffffu;  // |e|; -0 is 0
    const std::uint32_t bin = bits >> 20;
    return bin < std::uint32_t(kLogBins) ? int(bin) : -1;
}

// A histogram on those bins that knows which bins it has touched, so that sums over it and
// clearing it cost what the data spans (a few hundred bins), not all 2041.
struct LogHistogram {
    std::vector<std::uint32_t> counts;  // kLogBins, allocated on first use
    int first = kLogBins;  // touched bins: [first, last]
    int last = -1;

    // Adds `count` errors; to `total` as well when it is given (a sum over many histograms).
    void add(const float* errors, std::size_t count, LogHistogram* total = nullptr);
    void merge(const LogHistogram& other);
    // Counts of bins [first, first + size): a histogram kept compactly.
    void merge(int first, const std::uint32_t* counts, std::size_t size);
    void clear();
};

// BC of two such histograms.
double bcVsNoise(const LogHistogram& base, const LogHistogram& actual);

}  // namespace kvscope
