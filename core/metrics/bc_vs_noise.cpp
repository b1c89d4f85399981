#include "metrics/bc_vs_noise.h"

#include <algorithm>
#include <cmath>

namespace kvscope {

void addLogBins(const float* errors, std::size_t count, std::uint32_t* counts)
{
    for (std::size_t i = 0; i < count; ++i)
        if (const int bin = logBinOf(errors[i]); bin >= 0)
            ++counts[bin];
}

double bcVsNoise(const std::uint32_t* base, const std::uint32_t* actual)
{
    double nBase = 0, nActual = 0;
    for (int i = 0; i < kLogBins; ++i) {
        nBase += double(base[i]);
        nActual += double(actual[i]);
    }
    if (nBase == 0 || nActual == 0)
        return std::nan("");
    double bc = 0;
    for (int i = 0; i < kLogBins; ++i)
        if (base[i] && actual[i])
            bc += std::sqrt(double(base[i]) / nBase * double(actual[i]) / nActual);
    return std::clamp(bc, 0.0, 1.0);
}

}  // namespace kvscope
