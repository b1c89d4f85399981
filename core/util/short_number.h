#pragma once
// A number as the suspects' and the what-if's sentences print it: `digits` significant digits,
// the stream's shortest form ("0.25", "1.2e-05", "107").

#include <sstream>
#include <string>

namespace kvscope {

inline std::string shortNumber(double x, int digits = 3)
{
    std::ostringstream out;
    out.precision(digits);
    out << x;
    return out.str();
}

}  // namespace kvscope
