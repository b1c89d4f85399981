#pragma once
// Small floating-point formats (fp8 e4m3fn, e4m3fnuz, e5m2; fp4 e2m1; fp16): their grid,
// exact decoding, and encoding by round to nearest even that saturates to the largest finite
// value, as engines store a quantised KV cache (CUDA's cvt ... satfinite).

#include <cstdint>

namespace kvscope {

struct Minifloat {
    int exponentBits;
    int mantissaBits;
    int bias;
    // How the format spends its top codes: IEEE (all-ones exponent: infinities and NaN), Fn
    // (finite only: the all-ones code is NaN, OCP e4m3fn), Fnuz (finite only, no negative
    // zero: the sign-only code is NaN, AMD's e4m3fnuz).
    enum class Special { Ieee, Fn, Fnuz, None } special;

    int bits() const { return 1 + exponentBits + mantissaBits; }
    double maxFinite() const;
    double minNormal() const;     // 2^(1 - bias)
    double minSubnormal() const;  // 2^(1 - bias - mantissaBits)
};

inline constexpr Minifloat kFp16{5, 10, 15, Minifloat::Special::Ieee};
inline constexpr Minifloat kE4M3Fn{4, 3, 7, Minifloat::Special::Fn};        // max 448
inline constexpr Minifloat kE4M3Fnuz{4, 3, 8, Minifloat::Special::Fnuz};    // max 240
inline constexpr Minifloat kE5M2{5, 2, 15, Minifloat::Special::Ieee};       // max 57344
inline constexpr Minifloat kE2M1{2, 1, 1, Minifloat::Special::None};        // max 6, no NaN

// The value of a code (exact in float).
float decodeMinifloat(const Minifloat& format, std::uint32_t code);
// The code of `value` rounded to nearest even; beyond the finite range it saturates (an IEEE
// format's infinity stays infinite); NaN gives the format's NaN (e2m1 has none: 0).
std::uint32_t encodeMinifloat(const Minifloat& format, float value);
// The value encodeMinifloat's code stands for, computed without the code: the grid point
// nearest `value` (ties to even), saturated. For the hot loops that quantise and compare.
float roundToMinifloat(const Minifloat& format, float value);

}  // namespace kvscope
