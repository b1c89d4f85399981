#include "format/dtype.h"

#include "format/minifloat.h"
#include "util/simd_clones.h"

#include <algorithm>
#include <bit>
#include <cstring>
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
    case DType::Float8E4M3Fnuz:
    case DType::Int8:
    case DType::Float4E2M1:
    case DType::Int4TokenHead:
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
    case DType::Float8E4M3:
    case DType::Float8E4M3Fnuz: return std::ldexp(1.0, -4);
    case DType::Float8E5M2: return std::ldexp(1.0, -3);
    case DType::Int8: return std::ldexp(1.0, -8);
    case DType::Float4E2M1: return std::ldexp(1.0, -2);
    case DType::Int4TokenHead: return 1.0 / 30.0;
    }
    return 0;
}

bool isQuantised(DType dtype)
{
    return dtype == DType::Float8E4M3 || dtype == DType::Float8E5M2 || dtype == DType::Float8E4M3Fnuz ||
           dtype == DType::Int8 || dtype == DType::Float4E2M1 || dtype == DType::Int4TokenHead;
}

double maxFinite(DType dtype)
{
    switch (dtype) {
    case DType::Float8E4M3: return kE4M3Fn.maxFinite();
    case DType::Float8E5M2: return kE5M2.maxFinite();
    case DType::Float8E4M3Fnuz: return kE4M3Fnuz.maxFinite();
    case DType::Int8: return 127.0;
    case DType::Float4E2M1: return kE2M1.maxFinite();
    case DType::Int4TokenHead: return 15.0;
    case DType::BFloat16: return 3.3895313892515355e38;
    case DType::Float16: return 65504.0;
    case DType::Float32: return 3.4028234663852886e38;
    }
    return 0;
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
    case DType::Float8E4M3Fnuz:
        return "float8_e4m3fnuz";
    case DType::Int8:
        return "int8";
    case DType::Float4E2M1:
        return "float4_e2m1fn";
    case DType::Int4TokenHead:
        return "int4_per_token_head";
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
    // (vLLM's per-token-head modes are these formats with a scale per token and head.)
    if (name == "float8_e4m3fn" || name == "fp8_e4m3" || name == "fp8" || name == "fp8_per_token_head")
        return DType::Float8E4M3;
    if (name == "float8_e5m2" || name == "fp8_e5m2")
        return DType::Float8E5M2;
    if (name == "float8_e4m3fnuz" || name == "fp8_e4m3fnuz")
        return DType::Float8E4M3Fnuz;
    if (name == "int8" || name == "int8_per_token_head")
        return DType::Int8;
    if (name == "float4_e2m1fn" || name == "nvfp4")
        return DType::Float4E2M1;
    if (name == "int4_per_token_head")
        return DType::Int4TokenHead;
    return std::nullopt;
}

float bf16ToFloat(std::uint16_t bits)
{
    return std::bit_cast<float>(std::uint32_t(bits) << 16);
}

float fp16ToFloat(std::uint16_t bits)
{
    return decodeMinifloat(kFp16, bits);
}

float fp8e4m3ToFloat(std::uint8_t bits)
{
    return decodeMinifloat(kE4M3Fn, bits);
}

float fp8e5m2ToFloat(std::uint8_t bits)
{
    return decodeMinifloat(kE5M2, bits);
}

float fp8e4m3fnuzToFloat(std::uint8_t bits)
{
    return decodeMinifloat(kE4M3Fnuz, bits);
}

float e2m1ToFloat(std::uint8_t code)
{
    return code < 16 ? decodeMinifloat(kE2M1, code) : std::numeric_limits<float>::quiet_NaN();
}

namespace {
// Lookup tables make decoding of 8- and 16-bit formats a single load.
struct DecodeTables {
    float fp16[65536];
    float e4m3[256];
    float e5m2[256];
    float e4m3fnuz[256];
    float int8[256];
    float e2m1[256];   // codes above 15 NaN (readers refuse them first)
    float uint4[256];  // an int4 code as its number (int4 rows decode in format/int4_rht.h)
    DecodeTables()
    {
        for (std::uint32_t i = 0; i < 65536; ++i)
            fp16[i] = fp16ToFloat(std::uint16_t(i));
        for (std::uint32_t i = 0; i < 256; ++i) {
            e4m3[i] = fp8e4m3ToFloat(std::uint8_t(i));
            e5m2[i] = fp8e5m2ToFloat(std::uint8_t(i));
            e4m3fnuz[i] = fp8e4m3fnuzToFloat(std::uint8_t(i));
            int8[i] = float(std::int8_t(std::uint8_t(i)));
            e2m1[i] = e2m1ToFloat(std::uint8_t(i));
            uint4[i] = i < 16 ? float(i) : std::numeric_limits<float>::quiet_NaN();
        }
    }
};
const DecodeTables& tables()
{
    static const DecodeTables instance;
    return instance;
}

const float* byteTable(DType dtype)
{
    switch (dtype) {
    case DType::Float8E4M3: return tables().e4m3;
    case DType::Float8E5M2: return tables().e5m2;
    case DType::Float8E4M3Fnuz: return tables().e4m3fnuz;
    case DType::Int8: return tables().int8;
    case DType::Float4E2M1: return tables().e2m1;
    case DType::Int4TokenHead: return tables().uint4;
    default: return nullptr;
    }
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
    case DType::Float8E5M2:
    case DType::Float8E4M3Fnuz:
    case DType::Int8:
    case DType::Float4E2M1:
    case DType::Int4TokenHead: {
        const auto* in = static_cast<const std::uint8_t*>(src);
        const float* table = byteTable(dtype);
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

std::uint16_t floatToFp16(float value)
{
    // IEEE: from halfway above the largest finite value (whose mantissa is odd) on, infinity.
    const double top = kFp16.maxFinite() + std::ldexp(1.0, 15 - kFp16.mantissaBits - 1);
    if (!std::isnan(value) && std::fabs(double(value)) >= top)
        return std::uint16_t(std::signbit(value) ? 0xfc00 : 0x7c00);
    return std::uint16_t(encodeMinifloat(kFp16, value));
}

std::uint8_t floatToFp8e4m3(float value)
{
    return std::uint8_t(encodeMinifloat(kE4M3Fn, value));
}

std::uint8_t floatToFp8e5m2(float value)
{
    return std::uint8_t(encodeMinifloat(kE5M2, value));
}

std::uint8_t floatToFp8e4m3fnuz(float value)
{
    return std::uint8_t(encodeMinifloat(kE4M3Fnuz, value));
}

std::uint8_t floatToInt8(float value)
{
    if (std::isnan(value))
        return 0;
    const float rounded = std::nearbyint(std::clamp(value, -128.0f, 127.0f));
    return std::uint8_t(std::int8_t(rounded));
}

std::uint8_t floatToE2M1(float value)
{
    return std::uint8_t(encodeMinifloat(kE2M1, value));
}

std::uint8_t floatToUInt4(float value)
{
    if (std::isnan(value))
        return 0;
    return std::uint8_t(std::clamp(std::round(value), 0.0f, 15.0f));
}

float roundToDType(DType dtype, float value)
{
    switch (dtype) {
    case DType::BFloat16: return bf16ToFloat(floatToBf16(value));
    case DType::Float16: return fp16ToFloat(floatToFp16(value));
    case DType::Float32: return value;
    case DType::Float8E4M3: return roundToMinifloat(kE4M3Fn, value);
    case DType::Float8E5M2: return roundToMinifloat(kE5M2, value);
    case DType::Float8E4M3Fnuz: return roundToMinifloat(kE4M3Fnuz, value);
    case DType::Int8: return std::isnan(value) ? 0.0f : std::nearbyint(std::clamp(value, -128.0f, 127.0f));
    case DType::Float4E2M1: return roundToMinifloat(kE2M1, value);
    case DType::Int4TokenHead: return float(floatToUInt4(value));
    }
    return value;
}

void encodeFromFloat(DType dtype, const float* src, std::size_t count, void* dst, float scale)
{
    auto* out = static_cast<std::uint8_t*>(dst);
    for (std::size_t i = 0; i < count; ++i) {
        const float v = src[i] / scale;
        switch (dtype) {
        case DType::Float32:
            std::memcpy(out + 4 * i, &v, 4);
            break;
        case DType::BFloat16: {
            const std::uint16_t b = floatToBf16(v);
            std::memcpy(out + 2 * i, &b, 2);
            break;
        }
        case DType::Float16: {
            const std::uint16_t b = floatToFp16(v);
            std::memcpy(out + 2 * i, &b, 2);
            break;
        }
        case DType::Float8E4M3: out[i] = floatToFp8e4m3(v); break;
        case DType::Float8E5M2: out[i] = floatToFp8e5m2(v); break;
        case DType::Float8E4M3Fnuz: out[i] = floatToFp8e4m3fnuz(v); break;
        case DType::Int8: out[i] = floatToInt8(v); break;
        case DType::Float4E2M1: out[i] = floatToE2M1(v); break;
        case DType::Int4TokenHead: out[i] = floatToUInt4(v); break;
        }
    }
}

}  // namespace kvscope
