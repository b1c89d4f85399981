#include "format/nvfp4.h"

#include "format/minifloat.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>

namespace kvscope {

float nvfp4GlobalScale(float amax)
{
    const float global = amax / (float(kE2M1.maxFinite()) * float(kE4M3Fn.maxFinite()));
    return global > 0 && std::isfinite(global) ? global : 1.0f;
}

std::uint8_t nvfp4QuantiseBlock(const float* x, int n, float global, std::uint8_t* codes)
{
    float amax = 0;
    for (int i = 0; i < n; ++i)
        amax = std::max(amax, std::fabs(x[i]));
    // The kernel's order of operations: the reciprocal of the global scale, then amax / 6.
    const float inverse = 1.0f / global;
    const std::uint8_t sfBits = floatToFp8e4m3(inverse * amax / 6.0f);
    const float sf = fp8e4m3ToFloat(sfBits);
    for (int i = 0; i < n; ++i)
        codes[i] = sf > 0 ? floatToE2M1(x[i] * inverse / sf) : std::uint8_t(0);
    return sfBits;
}

void nvfp4Requantise(const float* x, int n, float blockScale, float global, float* out)
{
    const float inverse = 1.0f / global;
    for (int i = 0; i < n; ++i)
        out[i] = blockScale > 0 ? roundToMinifloat(kE2M1, x[i] * inverse / blockScale) * blockScale * global : 0.0f;
}

RawTensor nvfp4Tensor(std::vector<std::int64_t> shape, const std::vector<float>& values, float global)
{
    if (shape.size() != 4 || shape[3] % kNvfp4Block != 0)
        throw std::invalid_argument("NVFP4 needs [blocks, heads, block_size, head_dim] with head_dim a multiple of 16, got " +
                                    shapeToString(shape));
    RawTensor t;
    t.dtype = DType::Float4E2M1;
    t.shape = std::move(shape);
    const std::size_t n = values.size(), blocks = n / kNvfp4Block;
    t.bytes.resize(n);
    std::vector<float> scales(blocks);
    for (std::size_t b = 0; b < blocks; ++b)
        scales[b] = fp8e4m3ToFloat(nvfp4QuantiseBlock(values.data() + b * kNvfp4Block, kNvfp4Block, global,
                                                      t.bytes.data() + b * kNvfp4Block));
    t.setScales(ScaleGranularity::TokenGroup, std::move(scales));
    t.scale = global;  // after setScales, which resets it
    return t;
}

}  // namespace kvscope
