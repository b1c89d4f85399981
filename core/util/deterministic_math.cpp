#include "util/deterministic_math.h"

#include <bit>
#include <cmath>
#include <initializer_list>
#include <limits>

namespace kvscope::detmath {

namespace {

constexpr double kLn2Hi = 6.93147180369123816490e-01;  // ln 2 in two parts (fdlibm's split)
constexpr double kLn2Lo = 1.90821492927058770002e-10;
constexpr double kInvLn2 = 1.44269504088896338700e+00;
constexpr double kTwoOverPi = 6.36619772367581382433e-01;
constexpr double kPio2Part1 = 1.57079632673412561417e+00;  // pi/2 in three parts (fdlibm's split)
constexpr double kPio2Part2 = 6.07710050630396597660e-11;
constexpr double kPio2Part3 = 2.02226624871116645580e-21;

// Taylor polynomials by Horner's rule, |r| <= pi/4: the first omitted terms are below 1e-19.
double sinPoly(double r)
{
    const double r2 = r * r;
    double p = 1.0 / 355687428096000.0;  // 1/17!
    for (double factorial : {-1307674368000.0, 6227020800.0, -39916800.0, 362880.0, -5040.0, 120.0, -6.0})
        p = p * r2 + 1.0 / factorial;  // -1/15!, +1/13!, ..., -1/3!
    return r + r * r2 * p;
}

double cosPoly(double r)
{
    const double r2 = r * r;
    double p = -1.0 / 6402373705728000.0;  // -1/18!
    for (double factorial : {20922789888000.0, -87178291200.0, 479001600.0, -3628800.0, 40320.0, -720.0, 24.0, -2.0})
        p = p * r2 + 1.0 / factorial;  // +1/16!, -1/14!, ..., -1/2!
    return 1.0 + r2 * p;
}

}  // namespace

double exp(double x)
{
    if (std::isnan(x))
        return x;
    if (x > 709.78)
        return std::numeric_limits<double>::infinity();
    if (x < -745.2)
        return 0.0;
    // x = k ln2 + r, |r| <= ln2 / 2; e^r by its Taylor series (the 14th term is below 1e-17).
    const double k = std::nearbyint(x * kInvLn2);
    const double r = (x - k * kLn2Hi) - k * kLn2Lo;
    double p = 1.0 / 6227020800.0;  // 1/13!
    for (double f : {479001600.0, 39916800.0, 3628800.0, 362880.0, 40320.0, 5040.0, 720.0, 120.0, 24.0, 6.0, 2.0,
                     1.0, 1.0})
        p = p * r + 1.0 / f;
    return std::ldexp(p, int(k));
}

double log(double x)
{
    if (std::isnan(x) || x < 0)
        return std::numeric_limits<double>::quiet_NaN();
    if (x == 0)
        return -std::numeric_limits<double>::infinity();
    if (std::isinf(x))
        return x;
    // x = m 2^e with m in [sqrt(1/2), sqrt(2)); log m = 2 atanh(s), s = (m - 1) / (m + 1).
    int e = 0;
    double m = std::frexp(x, &e);  // m in [0.5, 1), exact
    if (m < 0.70710678118654752440) {
        m *= 2;
        --e;
    }
    const double s = (m - 1) / (m + 1), s2 = s * s;
    double p = 1.0 / 23;
    for (int odd = 21; odd >= 1; odd -= 2)
        p = p * s2 + 1.0 / odd;
    return (double(e) * kLn2Hi + 2 * s * p) + double(e) * kLn2Lo;
}

void sinCos(double x, double& sin, double& cos)
{
    const double n = std::nearbyint(x * kTwoOverPi);
    const double r = ((x - n * kPio2Part1) - n * kPio2Part2) - n * kPio2Part3;
    const double s = sinPoly(r), c = cosPoly(r);
    switch (static_cast<long long>(n) & 3) {
    case 0: sin = s; cos = c; break;
    case 1: sin = c; cos = -s; break;
    case 2: sin = -s; cos = -c; break;
    default: sin = -c; cos = s; break;
    }
}

float roundToBf16(float x)
{
    const std::uint32_t bits = std::bit_cast<std::uint32_t>(x);
    if (std::isnan(x))
        return std::bit_cast<float>((bits | 0x00400000u) & 0xffff0000u);
    const std::uint32_t rounded = (bits + 0x7fffu + ((bits >> 16) & 1u)) & 0xffff0000u;
    return std::bit_cast<float>(rounded);
}

double NormalSampler::operator()()
{
    if (m_hasSpare) {
        m_hasSpare = false;
        return m_spare;
    }
    const double u1 = (double(m_bits.next() >> 11) + 0.5) * 0x1.0p-53;  // (0, 1)
    const double u2 = m_bits.uniform();
    const double radius = std::sqrt(-2.0 * log(u1));
    double s = 0, c = 0;
    sinCos(6.28318530717958647692 * u2, s, c);
    m_spare = radius * s;
    m_hasSpare = true;
    return radius * c;
}

}  // namespace kvscope::detmath
