#pragma once
// Small floating-point formats (fp8 e4m3fn, e4m3fnuz, e5m2; fp4 e2m1; fp16): their grid,
// exact decoding, and encoding by round to nearest even that saturates to the largest finite
// value, as engines store a quantised KV cache (CUDA's cvt ... satfinite).

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>

namespace kvscope {

struct Minifloat {
    // How the format spends its top codes: IEEE (all-ones exponent: infinities and NaN), Fn
    // (finite only: the all-ones code is NaN, OCP e4m3fn), Fnuz (finite only, no negative
    // zero: the sign-only code is NaN, AMD's e4m3fnuz), None (every code a number: e2m1).
    enum class Special { Ieee, Fn, Fnuz, None };

    int exponentBits;
    int mantissaBits;
    int bias;
    Special special;
    // Derived once (the hot loops read them per value).
    float largest;   // the largest finite value
    float normal;    // the smallest normal value, 2^(1 - bias)
    float tiniest;   // the smallest subnormal value, 2^(1 - bias - mantissaBits)

    static constexpr Minifloat make(int exponentBits, int mantissaBits, int bias, Special special)
    {
        const int top = (1 << exponentBits) - 1 - bias;
        const double ulp = pow2(-mantissaBits);
        const double largest = special == Special::Ieee ? (2.0 - ulp) * pow2(top - 1)
                               : special == Special::Fn  ? (2.0 - 2 * ulp) * pow2(top)
                                                         : (2.0 - ulp) * pow2(top);
        return {exponentBits, mantissaBits, bias, special, float(largest), float(pow2(1 - bias)),
                float(pow2(1 - bias - mantissaBits))};
    }
    int bits() const { return 1 + exponentBits + mantissaBits; }
    double maxFinite() const { return largest; }
    double minNormal() const { return normal; }
    double minSubnormal() const { return tiniest; }

private:
    static constexpr double pow2(int e)
    {
        double x = 1;
        for (; e > 0; --e)
            x *= 2;
        for (; e < 0; ++e)
            x /= 2;
        return x;
    }
};

inline constexpr Minifloat kFp16 = Minifloat::make(5, 10, 15, Minifloat::Special::Ieee);
inline constexpr Minifloat kE4M3Fn = Minifloat::make(4, 3, 7, Minifloat::Special::Fn);        // max 448
inline constexpr Minifloat kE4M3Fnuz = Minifloat::make(4, 3, 8, Minifloat::Special::Fnuz);    // max 240
inline constexpr Minifloat kE5M2 = Minifloat::make(5, 2, 15, Minifloat::Special::Ieee);       // max 57344
inline constexpr Minifloat kE2M1 = Minifloat::make(2, 1, 1, Minifloat::Special::None);        // max 6, no NaN

// The value of a code (exact in float).
float decodeMinifloat(const Minifloat& format, std::uint32_t code);
// The code of `value` rounded to nearest even; beyond the finite range it saturates (an IEEE
// format's infinity stays infinite); NaN gives the format's NaN (e2m1 has none: 0).
std::uint32_t encodeMinifloat(const Minifloat& format, float value);
// The value encodeMinifloat's code stands for, computed without the code: the grid point
// nearest `value` (ties to even), saturated. For the hot loops that quantise and compare.
// Inline: the what-if and the quantisation floor call it per value.
inline float roundToMinifloat(const Minifloat& f, float value)
{
    if (std::isnan(value))
        return f.special == Minifloat::Special::None ? 0.0f : value;
    const float maxFinite = f.largest;
    const float magnitude = std::fabs(value);
    float rounded;
    if (magnitude >= maxFinite) {
        rounded = maxFinite;
    } else if (magnitude < f.normal) {
        // One fixed step below the normal range: the division by a power of two is exact,
        // and nearbyint rounds ties to even in the default mode.
        const float step = f.tiniest;
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


}  // namespace kvscope
