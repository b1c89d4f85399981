#pragma once
// The median of a set of numbers, as the floors and the what-if take it: the upper middle
// element (no averaging of the two middle ones), NaN for none; and other quantiles the same
// way (the element at rank floor(q * n) of the sorted values).

#include <vector>

namespace kvscope {

// Reorders `values`.
double medianInPlace(std::vector<double>& values);
inline double median(std::vector<double> values)
{
    return medianInPlace(values);
}
// The element at rank floor(q * n), q in [0, 1) (0.5: the median). Reorders `values`.
double upperQuantileInPlace(std::vector<double>& values, double q);

}  // namespace kvscope
