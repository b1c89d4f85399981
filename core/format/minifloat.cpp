#include "format/minifloat.h"

#include <bit>
#include <cmath>
#include <limits>

namespace kvscope {

namespace {

std::uint32_t maxExponentCode(const Minifloat& f)
{
    return (1u << f.exponentBits) - 1;
}

float withSign(float magnitude, bool negative)
{
    return negative ? -magnitude : magnitude;
}

}  // namespace

float decodeMinifloat(const Minifloat& f, std::uint32_t code)
{
    const int m = f.mantissaBits;
    const bool negative = (code >> (f.exponentBits + m)) & 1u;
    const std::uint32_t exponent = (code >> m) & maxExponentCode(f);
    const std::uint32_t mantissa = code & ((1u << m) - 1);
    const float nan = std::numeric_limits<float>::quiet_NaN();
    if (f.special == Minifloat::Special::Fnuz && negative && exponent == 0 && mantissa == 0)
        return nan;
    if (f.special == Minifloat::Special::Fn && exponent == maxExponentCode(f) && mantissa == (1u << m) - 1)
        return nan;
    if (f.special == Minifloat::Special::Ieee && exponent == maxExponentCode(f))
        return mantissa ? nan : withSign(std::numeric_limits<float>::infinity(), negative);
    if (exponent == 0)
        return withSign(std::ldexp(float(mantissa), 1 - f.bias - m), negative);
    return withSign(std::ldexp(float(mantissa | (1u << m)), int(exponent) - f.bias - m), negative);
}

std::uint32_t encodeMinifloat(const Minifloat& f, float value)
{
    const int m = f.mantissaBits;
    const std::uint32_t signBit = 1u << (f.exponentBits + m);
    const std::uint32_t sign = std::signbit(value) ? signBit : 0u;
    if (std::isnan(value)) {
        switch (f.special) {
        case Minifloat::Special::Ieee: return sign | (maxExponentCode(f) << m) | (1u << (m - 1));
        case Minifloat::Special::Fn: return sign | (maxExponentCode(f) << m) | ((1u << m) - 1);
        case Minifloat::Special::Fnuz: return signBit;
        case Minifloat::Special::None: return 0;
        }
    }
    const float rounded = std::fabs(roundToMinifloat(f, value));
    if (rounded == 0.0f)
        return f.special == Minifloat::Special::Fnuz ? 0u : sign;  // fnuz has no negative zero
    const int exponent = std::ilogb(rounded);
    if (exponent < 1 - f.bias)
        return sign | std::uint32_t(rounded / float(f.minSubnormal()));
    const std::uint32_t mantissa = std::uint32_t(std::ldexp(rounded, m - exponent)) & ((1u << m) - 1);
    return sign | (std::uint32_t(exponent + f.bias) << m) | mantissa;
}

}  // namespace kvscope
