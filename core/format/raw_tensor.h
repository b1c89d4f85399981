#pragma once
// A dense row-major tensor kept in its original storage dtype (no conversion), as read
// from or written to a bundle.

#include "format/dtype.h"
#include "util/buffer_allocator.h"

#include <cstdint>
#include <string>
#include <vector>

namespace kvscope {

struct RawTensor {
    DType dtype = DType::Float32;
    std::vector<std::int64_t> shape;
    // Uninitialised on resize: readers and writers fill every byte.
    std::vector<std::uint8_t, BufferAllocator<std::uint8_t>> bytes;
    // Dequantisation scale: stored values times scale give the real values (fp8 caches).
    float scale = 1.0f;

    std::int64_t numel() const;
    // Element stride of dimension `dim` in a row-major layout.
    std::int64_t stride(int dim) const;
    // Decodes `count` elements starting at element `offset`, applying the scale.
    void decode(std::int64_t offset, std::int64_t count, float* dst) const;
    std::vector<float> toFloat() const;

    static RawTensor fromFloat(DType dtype, std::vector<std::int64_t> shape,
                               const std::vector<float>& values, float scale = 1.0f);
};

std::string shapeToString(const std::vector<std::int64_t>& shape);

}  // namespace kvscope
