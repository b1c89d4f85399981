#pragma once
// The engine's paged KV as it is handed over: block tables and per-rank shards of blocks.

#include "format/raw_tensor.h"

#include <cstdint>
#include <vector>

namespace kvscope {

enum class KvPart { K, V };
inline const char* kvPartName(KvPart part) { return part == KvPart::K ? "k" : "v"; }

// One group's block table: [rows, cols] physical block ids, -1 = null block.
struct BlockTable {
    std::int64_t rows = 0;
    std::int64_t cols = 0;
    std::vector<std::int32_t> entries;
    std::int32_t at(std::int64_t row, std::int64_t col) const { return entries[std::size_t(row * cols + col)]; }
};

// Whether a read fetches a tensor's values, or only what they are: dtype, scales, shape and
// which blocks are stored, every structural check made (kvscope inspect shows which positions
// a layer holds without reading them). LayoutOnly leaves RawTensor::bytes empty.
enum class ValueRead { Values, LayoutOnly };

// One rank's K or V of one layer: blocks [n, heads_per_rank, block_size, head_dim] and the
// physical block id of each of the n rows (rows need not be all blocks nor in order).
struct PagedShard {
    RawTensor blocks;
    std::vector<std::int64_t> physicalIds;
};

// K and V shards of one layer, indexed by TP rank. Ranks that do not contribute heads
// (replicas) may be left empty.
struct LayerShards {
    std::vector<PagedShard> k;
    std::vector<PagedShard> v;
};

// Which part of a reference [batch, heads, seq, head_dim] a tensor holds when it is not the
// whole: positions [firstRow, firstRow + rows) of one batch row, as [1, heads, rows, head_dim]
// (a window of tokens), with the stored dataset's batch and seq.
struct ReferenceSlab {
    std::int64_t batch = 0;
    std::int64_t seq = 0;
    std::int64_t firstRow = 0;
};

}  // namespace kvscope
