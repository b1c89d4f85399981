#include "util/median.h"

#include <algorithm>
#include <cmath>

namespace kvscope {

double medianInPlace(std::vector<double>& values)
{
    if (values.empty())
        return std::nan("");
    const auto mid = values.begin() + std::ptrdiff_t(values.size() / 2);
    std::nth_element(values.begin(), mid, values.end());
    return *mid;
}

}  // namespace kvscope
