#pragma once
// The inverse of reconstruction: lays contiguous per-layer KV of one sequence into a paged
// cache the way vLLM does, for synthetic captures. Physical block 0 is the null block; the
// others come from a shuffled free pool shared by every group; a SlidingWindowSpec group
// frees blocks that fall wholly out of the window as the sequence grows (their table entries
// become -1 or keep a stale id) and the pool reuses them first, so they hold other data.

#include "format/bundle_writer.h"
#include "format/kv_cache_config.h"
#include "kv/layer_kv.h"

#include <cstdint>
#include <functional>
#include <random>
#include <set>
#include <string>
#include <utility>

namespace kvscope {

// How an engine scales a quantised cache: one scale per tensor (K and V), one per head (over
// the total heads), or one per token and head: the row's largest magnitude over the format's
// largest value, computed from the row as it is written.
struct CacheScaling {
    ScaleGranularity granularity = ScaleGranularity::Tensor;
    float k = 1.0f, v = 1.0f;
    std::vector<float> kHeads, vHeads;
};

class PagedLayout {
public:
    // Allocates block tables for one sequence (batch of one) of `seqLen` tokens, of which
    // seqLen - 1 are written; each table row has `padding` more entries (-1) than needed, as
    // engines report rows of max_blocks. Throws std::invalid_argument when num_blocks is too small.
    PagedLayout(const KvCacheConfig& config, std::int64_t seqLen, std::uint64_t seed, int padding = 0);

    const std::vector<BlockTable>& blockTables() const { return m_tables; }
    // The physical block logical block `logical` of group `group` was written to.
    std::int32_t physicalOf(std::size_t group, std::int64_t logical) const;
    // Puts logical block `logical` of group `group` in physical block `physical`, as a
    // prefix-cache hit would (the block another sequence wrote): ids `physical` and the block's
    // own are exchanged wherever this layout uses them, so nothing else moves.
    void pin(std::size_t group, std::int64_t logical, std::int32_t physical);

    // The snapshot holding every layer: `layerKv(name)` gives the layer's contiguous KV
    // ([total heads, >= seqLen - 1, head_size]; only present positions are written).
    // Blocks no position uses hold deterministic noise (other sequences' data).
    // `scalingOf(layer)` gives how a quantised cache is scaled (default: per tensor, 1).
    EngineSnapshot snapshot(const std::function<LayerKv(const std::string&)>& layerKv, bool keepOnlyReferencedBlocks,
                            const std::function<CacheScaling(const std::string&)>& scalingOf = {}) const;

private:
    RawTensor encode(DType dtype, const std::vector<std::int64_t>& shape, const std::vector<float>& values,
                     const CacheScaling& scaling, KvPart part, const TpLayout& layout, int rank) const;

    KvCacheConfig m_config;
    std::int64_t m_seqLen;
    std::uint64_t m_seed;
    std::vector<BlockTable> m_tables;
    // Per group: the physical block each logical block was written to (before any freeing).
    std::vector<std::vector<std::int32_t>> m_writtenTo;
    std::vector<std::set<std::int64_t>> m_freed;  // per group: logical blocks given back
};

}  // namespace kvscope
