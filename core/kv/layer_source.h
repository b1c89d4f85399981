#pragma once
// One layer's K and V left in the tensors they were stored in, with where each position's
// heads lie. A row is decoded when it is needed: a token at a time by the analysis, which so
// never holds a layer in float (three sides of a 70B layer are 48 MB of float, written once
// and read twice, against 32 MB as stored), or every row at once into a LayerKv.

#include "format/paged_kv.h"
#include "format/raw_tensor.h"
#include "kv/layer_kv.h"
#include "kv/position_range.h"
#include "util/content_hash.h"

#include <cstdint>
#include <memory>
#include <vector>

namespace kvscope {

// Every head of one position, in float: head h's values start at
// data + h * headStride (in a LayerKv, a decoded tile, or a float32 tensor as stored).
struct RowView {
    const float* data = nullptr;
    std::size_t headStride = 0;
    const float* head(int h) const { return data + std::size_t(h) * headStride; }
};

// Consecutive heads of one position in one tensor: head i of the run starts at element
// offset + i * headStride and holds head_dim values. (No initialisers: a source's runs are
// left unwritten where its positions are absent.)
struct HeadRun {
    const RawTensor* tensor;
    std::int64_t offset;
    std::int64_t headStride;
};

struct LayerSource {
    int heads = 0;
    std::int64_t seq = 0;
    HeadDims dims;
    int runsPerRow = 1;  // each run holds heads / runsPerRow heads, in head order
    // [position][run], written where present: a window of a long sequence touches (and pays
    // for) the memory of its own positions only.
    std::unique_ptr<HeadRun[]> k, v;
    std::vector<std::uint8_t> present;
    std::vector<std::shared_ptr<const void>> storage;  // owns what the runs point into

    // Every position absent.
    static LayerSource absent(int heads, std::int64_t seq, HeadDims dims, int runsPerRow);

    int headDim(KvPart part) const { return dims.of(part); }
    std::size_t rowSize(KvPart part) const { return std::size_t(heads) * std::size_t(dims.of(part)); }
    HeadRun* runs(KvPart part, std::int64_t pos)
    {
        return (part == KvPart::K ? k : v).get() + std::size_t(pos) * std::size_t(runsPerRow);
    }
    const HeadRun* runs(KvPart part, std::int64_t pos) const
    {
        return (part == KvPart::K ? k : v).get() + std::size_t(pos) * std::size_t(runsPerRow);
    }
    // The row of present position `pos` where it is float32 as stored, in one run: read in
    // place, nothing decoded. Null data otherwise.
    RowView storedFloatRow(KvPart part, std::int64_t pos) const;
    // Every head of the present positions in [begin, end) of `part`, head-major: head h of
    // position p at out + (h * (end - begin) + p - begin) * headDim(part) (absent positions are
    // left as they are). A head's positions that follow each other in a tensor (a
    // reference's [heads, seq, head_dim]) decode in one call.
    void decodeHeads(KvPart part, std::int64_t begin, std::int64_t end, float* out) const;
    // Asks the CPU to fetch what decodeHeads() of [begin, end) will read (the next tile of
    // scattered blocks: each head's piece of a block starts where no hardware prefetcher
    // looks).
    void prefetchHeads(KvPart part, std::int64_t begin, std::int64_t end) const;
    // Every position decoded (absent ones NaN).
    LayerKv materialize() const;
    // A fingerprint of the present positions' values as stored (bytes, dtype, scales, and which
    // positions are present): equal for two references holding the same data the same way.
    std::uint64_t contentHash() const;
    // The same in windows of positions: startHash(), then addToHash() of each window in order,
    // gives contentHash()'s value once every present position was added.
    ContentHash startHash() const;
    void addToHash(ContentHash& hash, PositionRange window) const;
    // How head `head` of present position `pos` is stored: its dtype and dequantisation scale,
    // one per head row in every granularity but TokenGroup (fp8_ds_mla: one per 128 values),
    // whose value i has scaleOf(i).
    struct Storage {
        DType dtype;
        float scale;  // the row's first value's
        ScaleGranularity granularity;
        const RawTensor* tensor = nullptr;
        std::int64_t first = 0;  // the row's first element in `tensor`
        // What value i's code is multiplied by (NVFP4: its block's scale times the global one).
        float scaleOf(int i) const { return tensor ? tensor->dequantScaleAt(first + i) : scale; }
    };
    Storage storedAs(KvPart part, std::int64_t pos, int head) const;
};

}  // namespace kvscope
