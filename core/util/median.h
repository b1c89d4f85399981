#pragma once
// The median of a set of numbers, as the floors and the what-if take it: the upper middle
// element (no averaging of the two middle ones), NaN for none.

#include <vector>

namespace kvscope {

// Reorders `values`.
double medianInPlace(std::vector<double>& values);
inline double median(std::vector<double> values)
{
    return medianInPlace(values);
}

}  // namespace kvscope
