#pragma once
// vLLM's int4_per_token_head: each token's head vector x (head_dim d, a power of two) is rotated,
// x_rot = H_d (x * s), H_d the unnormalised Walsh-Hadamard transform (format/hadamard.h) and s
// fixed signs (+-1), then quantised asymmetrically over its d values:
//   scale = max((max - min) / 15, 1e-6), zp = clamp(round(-min / scale), 0, 15),
//   q = clamp(round(x_rot / scale + zp), 0, 15)    (rounding half away from zero).
// Decoded: the rotated values (q - zp) x scale, then x = s * H_d(rotated) / d. A bundle keeps the
// codes one per byte (DType::Int4TokenHead), the scales (float32) and zero points (uint8) per
// token and head, and the signs the capture used (docs/bundle-format.md).

#include "format/raw_tensor.h"

#include <cstdint>
#include <vector>

namespace kvscope {

struct Int4RhtRow {
    float scale = 0;
    std::uint8_t zeroPoint = 0;
};

// Quantises one head row of d values as vLLM does (its rotation computed in double and rounded
// once to float: vLLM rotates in float32, in an order of its own, so a code at a rounding tie
// may differ). Writes d codes.
Int4RhtRow int4RhtQuantise(const float* x, int d, const std::int8_t* signs, std::uint8_t* codes);

// Decodes one head row. Every step is exact in double ((q - zp) x scale has 28 significant bits;
// the transform's sums of them stay below 2^53 units of the scale's last bit for any d up to
// 2^24; dividing by d and the signs are exact), so the float returned is the one nearest the
// exact value: an independent float64 decode (numpy's H @ rotated) gives the same bits.
void int4RhtDecode(const std::uint8_t* codes, int d, float scale, int zeroPoint, const std::int8_t* signs, float* out);

// x[0..d) as a row of this scale and zero point stores it, decoded: the quantisation floor.
void int4RhtRequantise(const float* x, int d, float scale, int zeroPoint, const std::int8_t* signs, float* out);

// kvscope's fixed signs for d values (its synth and what-if; captures store vLLM's): bits of
// SplitMix64 seeded 0x9E3779B9, bit i of draw i / 64 set: -1.
std::vector<std::int8_t> kvscopeRhtSigns(int d);

// `values` [blocks, heads, block_size, head_dim] stored as vLLM stores them (head_dim a power of
// two): codes, a scale and zero point per token and head, and `signs`.
RawTensor int4RhtTensor(std::vector<std::int64_t> shape, const std::vector<float>& values, std::vector<std::int8_t> signs);

}  // namespace kvscope
