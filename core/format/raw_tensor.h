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
    // Element e has scales[(e / elementsPerScale) % scales.size()]; `scale` is then 1, but for
    // NVFP4 (Float4E2M1), where it is the global scale: a value is code x scales[..] x scale.
    std::vector<float> scales;
    std::int64_t elementsPerScale = 0;
    // Int4TokenHead (format/int4_rht.h): each token and head's zero point, beside its scale in
    // `scales`, and the signs of the rotation its rows were quantised after ([head_dim], +-1).
    std::vector<std::uint8_t> zeroPoints;
    std::vector<std::int8_t> rhtSigns;

    std::int64_t numel() const;
    // Element stride of dimension `dim` in a row-major layout.
    std::int64_t stride(int dim) const;
    ScaleGranularity granularity() const;
    // The finer scale of element `element` (`scale` without finer ones).
    float scaleAt(std::int64_t element) const
    {
        return scales.empty() ? scale
                              : scales[std::size_t(element / elementsPerScale) % scales.size()];
    }
    // What element `element`'s code is multiplied by: scaleAt, times NVFP4's global scale.
    float dequantScaleAt(std::int64_t element) const
    {
        return scales.empty() ? scale : scales[std::size_t(element / elementsPerScale) % scales.size()] * scale;
    }
    // An Int4TokenHead row's zero point (the row holding element `element`).
    int zeroPointAt(std::int64_t element) const
    {
        return zeroPoints.empty() ? 0 : zeroPoints[std::size_t(element / shape.back()) % zeroPoints.size()];
    }
    // Sets one scale per head, per token and head, or per group of a token's head of a cache
    // shaped [blocks, heads, block_size, head_dim]; `values` has the granularity's shape,
    // flattened (TokenGroup: head_dim / groups values share a scale).
    void setScales(ScaleGranularity granularity, std::vector<float> values);
    // The shape of the scales' dataset: [heads], [blocks, heads, block_size] or [blocks, heads,
    // block_size, groups] ({} per tensor; NVFP4's always has its groups, even one).
    std::vector<std::int64_t> scalesShape() const;
    // Decodes `count` elements starting at element `offset`, applying the scales (an
    // Int4TokenHead tensor decodes whole head rows: a part of a row costs the row).
    void decode(std::int64_t offset, std::int64_t count, float* dst) const;
    std::vector<float> toFloat() const;

    static RawTensor fromFloat(DType dtype, std::vector<std::int64_t> shape,
                               const std::vector<float>& values, float scale = 1.0f);
    // A quantised cache [blocks, heads, block_size, head_dim] encoded with finer scales
    // (setScales), each element divided by its own.
    static RawTensor fromFloat(DType dtype, std::vector<std::int64_t> shape, const std::vector<float>& values,
                               ScaleGranularity granularity, std::vector<float> scales);

private:
    void decodeInt4Rows(std::int64_t offset, std::int64_t count, float* dst) const;
};

std::string shapeToString(const std::vector<std::int64_t>& shape);

}  // namespace kvscope
