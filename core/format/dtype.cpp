#include "format/dtype.h"

#include "util/simd_clones.h"

#include <bit>
#include <cmath>
#include <limits>

namespace kvscope {

std::size_t dtypeSize(DType dtype)
{
    switch (dtype) {
    case DType::BFloat16:
    case DType::Float16:
        return 2;
    case DType::Float32:
        return 4;
    case DType::Float8E4M3:
    case DType::Float8E5M2:
        return 1;
    }
    return 0;
}

double unitRoundoff(DType dtype)
{
    switch (dtype) {
    case DType::BFloat16: return std::ldexp(1.0, -8);
    case DType::Float16: return std::ldexp(1.0, -11);
    case DType::Float32: return std::ldexp(1.0, -24);
    case DType::Float8E4M3: return std::ldexp(1.0, -4);
    case DType::Float8E5M2: return std::ldexp(1.0, -3);
    }
    return 0;
}

bool isQuantised(DType dtype)
{
    return dtype == DType::Float8E4M3 || dtype == DType::Float8E5M2;
}

std::string dtypeName(DType dtype)
{
    switch (dtype) {
    case DType::BFloat16:
        return "bfloat16";
    case DType::Float16:
        return "float16";
    case DType::Float32:
        return "float32";
    case DType::Float8E4M3:
        return "float8_e4m3fn";
    case DType::Float8E5M2:
        return "float8_e5m2";
    }
    return "?";
}

std::optional<DType> parseDType(std::string_view name)
{
    if (name.starts_with("torch."))
        name.remove_prefix(6);
    if (name == "bfloat16")
        return DType::BFloat16;
    if (name == "float16" || name == "half")
        return DType::Float16;
    if (name == "float32" || name == "float")
        return DType::Float32;
    if (name == "float8_e4m3fn" || name == "fp8_e4m3" || name == "fp8")
        return DType::Float8E4M3;
    if (name == "float8_e5m2" || name == "fp8_e5m2")
        return DType::Float8E5M2;
    return std::nullopt;
}

float bf16ToFloat(std::uint16_t bits)
{
    return std::bit_cast<float>(std::uint32_t(bits) << 16);
}

// A small IEEE-like format with `expBits` exponent bits and `manBits` mantissa bits.
static float decodeMinifloat(std::uint32_t bits, int expBits, int manBits, bool hasInfinity)
{
    const std::uint32_t sign = bits >> (expBits + manBits);
    const std::uint32_t exponent = (bits >> manBits) & ((1u << expBits) - 1);
    const std::uint32_t mantissa = bits & ((1u << manBits) - 1);
    const int bias = (1 << (expBits - 1)) - 1;
    const std::uint32_t maxExponent = (1u << expBits) - 1;
    float magnitude;
    if (exponent == 0) {
        magnitude = std::ldexp(float(mantissa), 1 - bias - manBits);
    } else if (hasInfinity && exponent == maxExponent) {
        magnitude = mantissa == 0 ? std::numeric_limits<float>::infinity()
                                  : std::numeric_limits<float>::quiet_NaN();
    } else if (!hasInfinity && exponent == maxExponent && mantissa == (1u << manBits) - 1) {
        magnitude = std::numeric_limits<float>::quiet_NaN();
    } else {
        magnitude = std::ldexp(float(mantissa | (1u << manBits)), int(exponent) - bias - manBits);
    }
    return sign ? -magnitude : magnitude;
}

float fp16ToFloat(std::uint16_t bits)
{
    return decodeMinifloat(bits, 5, 10, true);
}

float fp8e4m3ToFloat(std::uint8_t bits)
{
    return decodeMinifloat(bits, 4, 3, false);
}

float fp8e5m2ToFloat(std::uint8_t bits)
{
    return decodeMinifloat(bits, 5, 2, true);
}

namespace {
// Lookup tables make decoding of 8- and 16-bit formats a single load.
struct DecodeTables {
    float fp16[65536];
    float e4m3[256];
    float e5m2[256];
    DecodeTables()
    {
        for (std::uint32_t i = 0; i < 65536; ++i)
            fp16[i] = fp16ToFloat(std::uint16_t(i));
        for (std::uint32_t i = 0; i < 256; ++i) {
            e4m3[i] = fp8e4m3ToFloat(std::uint8_t(i));
            e5m2[i] = fp8e5m2ToFloat(std::uint8_t(i));
        }
    }
};
const DecodeTables& tables()
{
    static const DecodeTables instance;
    return instance;
}
}  // namespace

KVSCOPE_VECTOR_CLONES
void decodeToFloat(DType dtype, const void* src, std::size_t count, float* dst, float scale)
{
    switch (dtype) {
    case DType::BFloat16: {
        const auto* in = static_cast<const std::uint16_t*>(src);
        for (std::size_t i = 0; i < count; ++i)
            dst[i] = bf16ToFloat(in[i]);
        break;
    }
    case DType::Float16: {
        const auto* in = static_cast<const std::uint16_t*>(src);
        const float* table = tables().fp16;
        for (std::size_t i = 0; i < count; ++i)
            dst[i] = table[in[i]];
        break;
    }
    case DType::Float32: {
        const auto* in = static_cast<const float*>(src);
        for (std::size_t i = 0; i < count; ++i)
            dst[i] = in[i];
        break;
    }
    case DType::Float8E4M3:
    case DType::Float8E5M2: {
        const auto* in = static_cast<const std::uint8_t*>(src);
        const float* table = dtype == DType::Float8E4M3 ? tables().e4m3 : tables().e5m2;
        for (std::size_t i = 0; i < count; ++i)
            dst[i] = table[in[i]];
        break;
    }
    }
    if (scale != 1.0f)
        for (std::size_t i = 0; i < count; ++i)
            dst[i] *= scale;
}

std::uint16_t floatToBf16(float value)
{
    const std::uint32_t bits = std::bit_cast<std::uint32_t>(value);
    if (std::isnan(value))
        return std::uint16_t((bits >> 16) | 0x40);
    const std::uint32_t roundingBias = 0x7fff + ((bits >> 16) & 1);
    return std::uint16_t((bits + roundingBias) >> 16);
}

// Round-to-nearest-even encoding into a minifloat; values beyond the largest finite
// value become infinity (when the format has one) or saturate.
static std::uint32_t encodeMinifloat(float value, int expBits, int manBits, bool hasInfinity)
{
    const std::uint32_t signBit = std::signbit(value) ? 1u << (expBits + manBits) : 0u;
    const int bias = (1 << (expBits - 1)) - 1;
    const std::uint32_t maxExponent = (1u << expBits) - 1;
    const std::uint32_t nanBits = hasInfinity ? (maxExponent << manBits) | (1u << (manBits - 1))
                                              : (maxExponent << manBits) | ((1u << manBits) - 1);
    if (std::isnan(value))
        return signBit | nanBits;
    // Largest finite: e4m3fn has max exponent with mantissa 110; others max exponent - 1.
    const float maxFinite = hasInfinity
        ? std::ldexp(float((2u << manBits) - 1), int(maxExponent) - 1 - bias - manBits)
        : std::ldexp(float((2u << manBits) - 2), int(maxExponent) - bias - manBits);
    const float magnitude = std::fabs(value);
    if (std::isinf(magnitude))
        return hasInfinity ? signBit | (maxExponent << manBits)
                           : signBit | encodeMinifloat(maxFinite, expBits, manBits, hasInfinity);
    // Quantise to the grid of the exponent the value falls into.
    const int minNormalExponent = 1 - bias;
    int exponent = magnitude == 0.0f ? minNormalExponent : std::ilogb(magnitude);
    if (exponent < minNormalExponent)
        exponent = minNormalExponent;
    const float step = std::ldexp(1.0f, exponent - manBits);
    const float quantised = std::nearbyint(magnitude / step) * step;  // default mode is to-nearest-even
    if (quantised > maxFinite) {
        if (hasInfinity && magnitude >= maxFinite + step / 2)
            return signBit | (maxExponent << manBits);
        return signBit | encodeMinifloat(maxFinite, expBits, manBits, hasInfinity);
    }
    if (quantised == 0.0f)
        return signBit;
    int qExponent = std::ilogb(quantised);
    if (qExponent < minNormalExponent)  // subnormal
        return signBit | std::uint32_t(quantised / std::ldexp(1.0f, minNormalExponent - manBits));
    const std::uint32_t mantissa =
        std::uint32_t(quantised / std::ldexp(1.0f, qExponent - manBits)) & ((1u << manBits) - 1);
    return signBit | (std::uint32_t(qExponent + bias) << manBits) | mantissa;
}

std::uint16_t floatToFp16(float value)
{
    return std::uint16_t(encodeMinifloat(value, 5, 10, true));
}

std::uint8_t floatToFp8e4m3(float value)
{
    return std::uint8_t(encodeMinifloat(value, 4, 3, false));
}

std::uint8_t floatToFp8e5m2(float value)
{
    return std::uint8_t(encodeMinifloat(value, 5, 2, true));
}

}  // namespace kvscope
