#pragma once
// One layer's K and V for one sequence, contiguous, with an explicit presence mask.

#include "util/buffer_allocator.h"

#include <cstdint>
#include <vector>

namespace kvscope {

// Layer buffers are tens of megabytes and always written (data or NaN) before they are read.
using FloatBuffer = std::vector<float, BufferAllocator<float>>;

// K and V laid out [seq, heads, head_dim] in float (every stored dtype converts exactly):
// position-major, so that everything about one token (all its heads) is contiguous.
// `present[p]` says whether position p holds data. Absent positions (outside a freed
// sliding window, never written, padding) hold NaN in k and v, so that any computation
// that forgets the mask produces NaN rather than a plausible number; the mask is the truth.
struct LayerKv {
    int heads = 0;
    std::int64_t seq = 0;
    int headDim = 0;
    FloatBuffer k;
    FloatBuffer v;
    std::vector<std::uint8_t> present;

    // Every position absent (NaN).
    static LayerKv absent(int heads, std::int64_t seq, int headDim);
    // Every position marked absent but its values left unwritten: the producer writes each
    // position, or clear()s it (see clearAbsent()).
    static LayerKv unwritten(int heads, std::int64_t seq, int headDim);
    // Fills every position not marked present with NaN.
    void clearAbsent();

    std::size_t index(int head, std::int64_t pos) const
    {
        return (std::size_t(pos) * std::size_t(heads) + std::size_t(head)) * std::size_t(headDim);
    }
    std::size_t rowSize() const { return std::size_t(heads) * std::size_t(headDim); }
    const float* kAt(int head, std::int64_t pos) const { return k.data() + index(head, pos); }
    const float* vAt(int head, std::int64_t pos) const { return v.data() + index(head, pos); }
    std::int64_t presentCount() const;
    // Marks position `pos` absent and fills it with NaN.
    void clear(std::int64_t pos);
};

}  // namespace kvscope
