#pragma once
// One layer's K and V for one sequence, contiguous, with an explicit presence mask.

#include <cstdint>
#include <vector>

namespace kvscope {

// K and V laid out [seq, heads, head_dim] in float (every stored dtype converts exactly):
// position-major, so that everything about one token (all its heads) is contiguous.
// `present[p]` says whether position p holds data. Absent positions (outside a freed
// sliding window, never written, padding) hold NaN in k and v, so that any computation
// that forgets the mask produces NaN rather than a plausible number; the mask is the truth.
struct LayerKv {
    int heads = 0;
    std::int64_t seq = 0;
    int headDim = 0;
    std::vector<float> k;
    std::vector<float> v;
    std::vector<std::uint8_t> present;

    static LayerKv absent(int heads, std::int64_t seq, int headDim);

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
