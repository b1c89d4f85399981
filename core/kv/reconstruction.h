#pragma once
// Paged to contiguous: one layer of one sequence (or every sequence of a batch), through
// its group's block table and block size, with the TP shards merged on the head axis and,
// under decode context parallelism, each position taken from the DCP rank that holds it.

#include "format/kv_cache_config.h"
#include "kv/layer_kv.h"
#include "kv/layer_source.h"
#include "format/paged_kv.h"
#include "kv/position_range.h"

#include <memory>
#include <string>
#include <vector>

namespace kvscope {

enum class UnreadableBlockPolicy {
    Error,       // a needed block that is null (-1), out of range or not stored throws
    MarkAbsent,  // ... becomes absent positions, and the problem is recorded in `problems`
};

struct ReconstructOptions {
    UnreadableBlockPolicy unreadableBlocks = UnreadableBlockPolicy::Error;
    // Named in error messages: the file and the object the data came from.
    std::string file;
    std::string object;
    // LayoutOnly: the shards hold no bytes (ValueRead), only the layout is built.
    ValueRead values = ValueRead::Values;
};

// The widths of one head of K and V in a layer of `group` (c_kv and k_pe for MLA).
inline HeadDims headDimsOf(const KvCacheGroup& group)
{
    return {group.partWidth(KvPart::K), group.partWidth(KvPart::V)};
}

// The first position the engine still holds for a sequence with `writtenLen` positions
// written: SlidingWindowSpec frees blocks wholly before writtenLen - sliding_window + 1
// (vLLM's last useful token), so only the last sliding_window - 1 positions are kept, as
// HF keeps them; ChunkedLocalAttentionSpec frees blocks wholly before the chunk of the next
// token (writtenLen / chunk * chunk). FullAttentionSpec keeps every position even with a
// sliding_window.
std::int64_t firstHeldPosition(const KvCacheGroup& group, std::int64_t writtenLen);

// Physical ids (sorted, unique) of the blocks that hold row `row`'s positions
// [firstHeldPosition, writtenLen) within `window`. Null, out-of-range entries are skipped
// (reconstruction reports them).
std::vector<std::int64_t> requiredBlocks(const KvCacheConfig& config, const std::string& layer,
                                         const BlockTable& table, std::int64_t row, std::int64_t writtenLen,
                                         PositionRange window = PositionRange::all());

// Reconstructs positions [0, writtenLen) of block-table row `row`, into `length` positions
// (default: writtenLen; positions from writtenLen on are absent). Positions outside a freed
// sliding window are absent, and so are those outside `window` (a window of tokens read at a
// time: `shards` need hold only its blocks). Throws BundleError on shards that disagree with
// the config, a layer that belongs to no group, and (with policy Error) unreadable blocks of
// the window; an unreadable block is named with all its positions, whatever the window.
LayerKv reconstructLayer(const KvCacheConfig& config, const std::string& layer, const LayerShards& shards,
                         const BlockTable& table, std::int64_t row, std::int64_t writtenLen,
                         const ReconstructOptions& options = {}, std::vector<std::string>* problems = nullptr,
                         std::int64_t length = -1, PositionRange window = PositionRange::all());

// The same left in the shards (kept alive by the result): where each position's heads lie.
LayerSource reconstructSource(const KvCacheConfig& config, const std::string& layer,
                              std::shared_ptr<const LayerShards> shards, const BlockTable& table, std::int64_t row,
                              std::int64_t writtenLen, const ReconstructOptions& options = {},
                              std::vector<std::string>* problems = nullptr, std::int64_t length = -1,
                              PositionRange window = PositionRange::all());

}  // namespace kvscope
