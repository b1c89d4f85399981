#pragma once
// NVFP4, vLLM's --kv-cache-dtype nvfp4: each value an e2m1 code, each run of 16 values of one
// token's head (along head_dim) sharing an e4m3 block scale, each layer and part one fp32 global
// scale (vLLM's _k_scale / _v_scale). A value is e2m1(code) x e4m3(block scale) x global, in
// float: the first product is exact (2 and 4 significant bits), so the value is the float
// nearest the exact product. A bundle keeps the codes one per byte (DType::Float4E2M1), the block
// scales as their e4m3 bits and the global scale as the dataset's `scale` (docs/bundle-format.md).

#include "format/raw_tensor.h"

#include <cstdint>
#include <vector>

namespace kvscope {

inline constexpr int kNvfp4Block = 16;

// The global scale kvscope's synth gives a tensor whose largest magnitude is `amax`:
// amax / (6 x 448), so that the largest block's scale is e4m3's largest (NVIDIA's calibration).
float nvfp4GlobalScale(float amax);

// Quantises n <= 16 values as vLLM's kernel does: SF = e4m3((1 / global) x amax / 6) (round to
// nearest even, saturating), each code e2m1(x x (1 / global) / SF) (round to nearest even,
// saturating at 6; a zero SF gives zeros). Returns SF's e4m3 bits.
std::uint8_t nvfp4QuantiseBlock(const float* x, int n, float global, std::uint8_t* codes);

// x[0..n) as a block of scale `blockScale` (decoded) under `global` stores them, decoded:
// what a cache with these scales holds for these values (the quantisation floor).
void nvfp4Requantise(const float* x, int n, float blockScale, float global, float* out);

// `values` [blocks, heads, block_size, head_dim] stored as vLLM stores them (head_dim a multiple
// of 16): codes, block scales (decoded, in `scales`) and `global` as the tensor's scale.
RawTensor nvfp4Tensor(std::vector<std::int64_t> shape, const std::vector<float>& values, float global);

}  // namespace kvscope
