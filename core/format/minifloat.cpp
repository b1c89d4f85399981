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

double Minifloat::maxFinite() const
{
    const int top = int(maxExponentCode(*this)) - bias;
    const double ulp = std::ldexp(1.0, -mantissaBits);
    switch (special) {
    case Special::Ieee: return std::ldexp(2.0 - ulp, top - 1);     // the top exponent is Inf/NaN
    case Special::Fn: return std::ldexp(2.0 - 2 * ulp, top);       // S.1111.111 is NaN
    case Special::Fnuz:
    case Special::None: return std::ldexp(2.0 - ulp, top);
    }
    return 0;
}

double Minifloat::minNormal() const
{
    return std::ldexp(1.0, 1 - bias);
}

double Minifloat::minSubnormal() const
{
    return std::ldexp(1.0, 1 - bias - mantissaBits);
}

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

float roundToMinifloat(const Minifloat& f, float value)
{
    if (std::isnan(value))
        return f.special == Minifloat::Special::None ? 0.0f : value;
    const float maxFinite = float(f.maxFinite());
    const float magnitude = std::fabs(value);
    float rounded;
    if (magnitude >= maxFinite) {
        rounded = maxFinite;
    } else if (magnitude < float(f.minNormal())) {
        // One fixed step below the normal range: the division by a power of two is exact,
        // and nearbyint rounds ties to even in the default mode.
        const float step = float(f.minSubnormal());
        rounded = std::nearbyint(magnitude / step) * step;
    } else {
        // Round float's 23-bit mantissa to the format's: add just under half a unit, plus the
        // kept part's lowest bit (ties to even); a carry moves into the exponent, as it should.
        const int drop = 23 - f.mantissaBits;
        std::uint32_t bits = std::bit_cast<std::uint32_t>(magnitude);
        bits += (1u << (drop - 1)) - 1 + ((bits >> drop) & 1u);
        bits &= ~((1u << drop) - 1);
        rounded = std::min(std::bit_cast<float>(bits), maxFinite);
    }
    return std::signbit(value) ? -rounded : rounded;
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
