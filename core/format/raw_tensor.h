#pragma once
// A dense row-major tensor kept in its original storage dtype (no conversion), as read
// from or written to a bundle.

#include "format/dtype.h"
#include "util/buffer_allocator.h"

#include <cstdint>
#include <string>
#include <vector>

namespace kvscope {

// How finely a quantised cache is scaled.
// TokenGroup: a scale per run of values within a token's head (fp8_ds_mla: one per 128).
enum class ScaleGranularity { Tensor, Head, TokenHead, TokenGroup };
const char* granularityName(ScaleGranularity granularity);  // "tensor", "head", "token_head", "token_group"

struct RawTensor {
    DType dtype = DType::Float32;
    std::vector<std::int64_t> shape;
    // Uninitialised on resize: readers and writers fill every byte.
    std::vector<std::uint8_t, BufferAllocator<std::uint8_t>> bytes;
    // Dequantisation scale: stored values times scale give the real values (fp8 caches).
    float scale = 1.0f;
    // Finer scales, as engines keep them beside a quantised cache [blocks, heads, block_size,
    // head_dim]: one per head ([heads]), per token and head ([blocks, heads, block_size]), or per
    // run of values within a token's head ([blocks, heads, block_size, groups]).
    // Element e has scales[(e / elementsPerScale) % scales.size()]; `scale` is then 1.
    std::vector<float> scales;
    std::int64_t elementsPerScale = 0;

    std::int64_t numel() const;
    // Element stride of dimension `dim` in a row-major layout.
    std::int64_t stride(int dim) const;
    ScaleGranularity granularity() const;
    // The dequantisation scale of element `element`.
    float scaleAt(std::int64_t element) const
    {
        return scales.empty() ? scale
                              : scales[std::size_t(element / elementsPerScale) % scales.size()];
    }
    // Sets one scale per head, per token and head, or per group of a token's head of a cache
    // shaped [blocks, heads, block_size, head_dim]; `values` has the granularity's shape,
    // flattened (TokenGroup: head_dim / groups values share a scale).
    void setScales(ScaleGranularity granularity, std::vector<float> values);
    // The shape of the scales' dataset: [heads], [blocks, heads, block_size] or [blocks, heads,
    // block_size, groups] ({} per tensor).
    std::vector<std::int64_t> scalesShape() const;
    // Decodes `count` elements starting at element `offset`, applying the scales.
    void decode(std::int64_t offset, std::int64_t count, float* dst) const;
    std::vector<float> toFloat() const;

    static RawTensor fromFloat(DType dtype, std::vector<std::int64_t> shape,
                               const std::vector<float>& values, float scale = 1.0f);
    // A quantised cache [blocks, heads, block_size, head_dim] encoded with finer scales
    // (setScales), each element divided by its own.
    static RawTensor fromFloat(DType dtype, std::vector<std::int64_t> shape, const std::vector<float>& values,
                               ScaleGranularity granularity, std::vector<float> scales);
};

std::string shapeToString(const std::vector<std::int64_t>& shape);

}  // namespace kvscope
