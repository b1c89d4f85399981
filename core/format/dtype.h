#pragma once
// The element types a KV cache can be stored in, and their exact decoding to float.

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace kvscope {

// Float8E4M3 is OCP e4m3fn (max 448, NVIDIA and vLLM); Float8E4M3Fnuz AMD's (max 240);
// Int8 a symmetric integer cache (values are code x scale).
// Float4E2M1 is NVFP4's value (vLLM's --kv-cache-dtype nvfp4): one e2m1 code per byte (0..15),
// times an e4m3 scale per 16 values (RawTensor::scales) times a global scale (RawTensor::scale).
// Int4TokenHead is vLLM's int4_per_token_head: one 4-bit code per byte (0..15) of the head
// vector rotated by a signed Walsh-Hadamard transform, with a scale and a zero point per token
// and head; a value is decoded a whole head row at a time (format/int4_rht.h), never alone.
enum class DType { BFloat16, Float16, Float32, Float8E4M3, Float8E5M2, Float8E4M3Fnuz, Int8, Float4E2M1, Int4TokenHead };

// Bytes per element.
std::size_t dtypeSize(DType dtype);

// The format's unit roundoff: the largest relative error of rounding a value in its normal
// range, half the spacing at a power of two, 2^-(mantissa bits + 1): bf16 2^-8, fp16 2^-11,
// fp32 2^-24, fp8 e4m3 2^-4, e5m2 2^-3, e2m1 2^-2 (NVFP4, whose block scales keep values in its
// normal range). For int8, whose error is absolute, half a code over the largest code: 2^-8;
// for int4 per token and head (asymmetric, absolute error scale / 2 over a span of 15 codes), 1/30.
double unitRoundoff(DType dtype);
// Whether a cache of this dtype is quantised (stored with scales, far coarser than bf16).
bool isQuantised(DType dtype);

// The largest finite magnitude of a quantised dtype (e4m3fn 448, e5m2 57344, e4m3fnuz 240,
// int8 127, e2m1 6; int4 per token and head 15, its span of codes): a scale of amax / maxFinite
// maps a tensor's largest value onto it.
double maxFinite(DType dtype);

// Canonical name as written in bundles ("bfloat16", "float16", "float32",
// "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "int8", "float4_e2m1fn",
// "int4_per_token_head").
std::string dtypeName(DType dtype);

// Accepts the canonical names, torch's spellings ("torch.bfloat16", "torch.half", ...) and vLLM's
// --kv-cache-dtype names ("fp8", "nvfp4", "fp8_per_token_head", "int8_per_token_head", ...).
std::optional<DType> parseDType(std::string_view name);

// Decoding is exact: every value of these formats is representable as a float.
float bf16ToFloat(std::uint16_t bits);
float fp16ToFloat(std::uint16_t bits);
float fp8e4m3ToFloat(std::uint8_t bits);  // e4m3fn: no infinities, 0x7f/0xff are NaN
float fp8e5m2ToFloat(std::uint8_t bits);
float fp8e4m3fnuzToFloat(std::uint8_t bits);  // no infinities, no negative zero: 0x80 is NaN
float e2m1ToFloat(std::uint8_t code);  // bit 3 the sign, bits 2-1 the exponent (bias 1), bit 0 the mantissa; > 15 is NaN

// Decodes `count` elements of `dtype` from `src` into `dst`, multiplying by `scale`
// (the dequantisation scale of quantised caches; 1 for the others).
void decodeToFloat(DType dtype, const void* src, std::size_t count, float* dst, float scale = 1.0f);

// Encoders, for writers and tests: round to nearest even, as torch does; the quantised
// formats saturate to their finite range, as engines store them.
std::uint16_t floatToBf16(float value);
std::uint16_t floatToFp16(float value);  // IEEE: overflow is infinite
std::uint8_t floatToFp8e4m3(float value);  // saturates to +-448
std::uint8_t floatToFp8e5m2(float value);  // saturates to +-57344
std::uint8_t floatToFp8e4m3fnuz(float value);  // saturates to +-240
std::uint8_t floatToInt8(float value);  // two's complement, saturates to [-128, 127]; NaN is 0
std::uint8_t floatToE2M1(float value);  // round to nearest even, saturates to +-6; NaN is 0 (e2m1 has none)
// An int4 code: rounded half away from zero (as vLLM's kernel rounds), clamped to [0, 15]; NaN is 0.
std::uint8_t floatToUInt4(float value);
// The value `dtype` stores for `value` (already divided by its scale): the nearest point of its
// grid, saturated; int8 its nearest code in [-128, 127]; int4 per token and head its code in
// [0, 15] (zero point included by the caller). The quantisation an engine applies.
float roundToDType(DType dtype, float value);
// Encodes `count` floats into `dtype`, dividing by `scale` first (the inverse of decodeToFloat).
void encodeFromFloat(DType dtype, const float* src, std::size_t count, void* dst, float scale = 1.0f);

}  // namespace kvscope
