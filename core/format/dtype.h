#pragma once
// The element types a KV cache can be stored in, and their exact decoding to float.

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace kvscope {

enum class DType { BFloat16, Float16, Float32, Float8E4M3, Float8E5M2 };

// Bytes per element.
std::size_t dtypeSize(DType dtype);

// The format's unit roundoff: the largest relative error of rounding a value in its normal
// range, half the spacing at a power of two, 2^-(mantissa bits + 1): bf16 2^-8, fp16 2^-11,
// fp32 2^-24, fp8 e4m3 2^-4, e5m2 2^-3.
double unitRoundoff(DType dtype);
// Whether a cache of this dtype is quantised (stored with scales, far coarser than bf16).
bool isQuantised(DType dtype);

// Canonical name as written in bundles ("bfloat16", "float16", "float32",
// "float8_e4m3fn", "float8_e5m2").
std::string dtypeName(DType dtype);

// Accepts the canonical names and torch's spellings ("torch.bfloat16", "torch.half", ...).
std::optional<DType> parseDType(std::string_view name);

// Decoding is exact: every value of these formats is representable as a float.
float bf16ToFloat(std::uint16_t bits);
float fp16ToFloat(std::uint16_t bits);
float fp8e4m3ToFloat(std::uint8_t bits);  // e4m3fn: no infinities, 0x7f/0xff are NaN
float fp8e5m2ToFloat(std::uint8_t bits);

// Decodes `count` elements of `dtype` from `src` into `dst`, multiplying by `scale`
// (the dequantisation scale of fp8 caches; 1 for the others).
void decodeToFloat(DType dtype, const void* src, std::size_t count, float* dst, float scale = 1.0f);

// Encoders, for writers and tests: round to nearest even, as torch does.
std::uint16_t floatToBf16(float value);
std::uint16_t floatToFp16(float value);
std::uint8_t floatToFp8e4m3(float value);  // saturates to +-448
std::uint8_t floatToFp8e5m2(float value);  // saturates to +-57344

}  // namespace kvscope
