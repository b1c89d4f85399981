#pragma once
// One layer's K and V for one sequence, contiguous, with an explicit presence mask.

#include "format/paged_kv.h"
#include "util/buffer_allocator.h"

#include <cstdint>
#include <vector>

namespace kvscope {

// Layer buffers are tens of megabytes and always written (data or NaN) before they are read.
using FloatBuffer = std::vector<float, BufferAllocator<float>>;

// The width of one head's K and of its V. Equal in attention layers; in an MLA layer K stands
// for the latent c_kv (kv_lora_rank wide) and V for the rotary key k_pe (qk_rope_head_dim wide).
struct HeadDims {
    int k = 0;
    int v = 0;
    HeadDims() = default;
    HeadDims(int both)  // NOLINT(google-explicit-constructor): one width for both is the usual case
        : k(both)
        , v(both)
    {
    }
    HeadDims(int kDim, int vDim)
        : k(kDim)
        , v(vDim)
    {
    }
    int of(KvPart part) const { return part == KvPart::K ? k : v; }
    bool operator==(const HeadDims&) const = default;
};

// K and V laid out [seq, heads, head_dim] in float (every stored dtype converts exactly):
// position-major, so that everything about one token (all its heads) is contiguous.
// `present[p]` says whether position p holds data. Absent positions (outside a freed
// sliding window, never written, padding) hold NaN in k and v, so that any computation
// that forgets the mask produces NaN rather than a plausible number; the mask is the truth.
struct LayerKv {
    int heads = 0;
    std::int64_t seq = 0;
    HeadDims dims;
    FloatBuffer k;
    FloatBuffer v;
    std::vector<std::uint8_t> present;

    // Every position absent (NaN).
    static LayerKv absent(int heads, std::int64_t seq, HeadDims dims);
    // Every position marked absent but its values left unwritten: the producer writes each
    // position, or clear()s it (see clearAbsent()).
    static LayerKv unwritten(int heads, std::int64_t seq, HeadDims dims);
    // Fills every position not marked present with NaN.
    void clearAbsent();

    int headDim(KvPart part) const { return dims.of(part); }
    std::size_t index(KvPart part, int head, std::int64_t pos) const
    {
        return (std::size_t(pos) * std::size_t(heads) + std::size_t(head)) * std::size_t(dims.of(part));
    }
    std::size_t rowSize(KvPart part) const { return std::size_t(heads) * std::size_t(dims.of(part)); }
    FloatBuffer& values(KvPart part) { return part == KvPart::K ? k : v; }
    const FloatBuffer& values(KvPart part) const { return part == KvPart::K ? k : v; }
    const float* at(KvPart part, int head, std::int64_t pos) const { return values(part).data() + index(part, head, pos); }
    const float* kAt(int head, std::int64_t pos) const { return at(KvPart::K, head, pos); }
    const float* vAt(int head, std::int64_t pos) const { return at(KvPart::V, head, pos); }
    std::int64_t presentCount() const;
    // Marks position `pos` absent and fills it with NaN.
    void clear(std::int64_t pos);
};

}  // namespace kvscope
