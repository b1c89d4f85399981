#include "util/median.h"

#include <algorithm>
#include <cmath>

namespace kvscope {

double medianInPlace(std::vector<double>& values)
{
    return upperQuantileInPlace(values, 0.5);
}

double upperQuantileInPlace(std::vector<double>& values, double q)
{
    if (values.empty())
        return std::nan("");
    const std::size_t rank = std::min(values.size() - 1, std::size_t(q * double(values.size())));
    const auto at = values.begin() + std::ptrdiff_t(rank);
    std::nth_element(values.begin(), at, values.end());
    return *at;
}

}  // namespace kvscope
