#pragma once
// The reference (HF past_key_values) side of one layer, aligned to the engine's positions.

#include "format/kv_cache_config.h"
#include "kv/layer_kv.h"
#include "kv/layer_source.h"
#include "kv/position_range.h"
#include "format/raw_tensor.h"

#include <optional>
#include <string>

namespace kvscope {

// `k` and `v` are [batch, heads, seq, head_dim]; row `batchRow` is taken. When seq equals
// `targetLen` every position is present. For a layer with a sliding window, HF may keep only
// the last sliding_window - 1 positions: those are placed at the end and the positions before
// are absent. Any other mismatch (heads, head_dim, length) throws BundleError naming
// `file` and `object`.
LayerKv alignReference(const RawTensor& k, const RawTensor& v, std::int64_t batchRow, const KvCacheConfig& config,
                       const KvCacheGroup& group, std::int64_t targetLen, const std::string& file,
                       const std::string& object);

// The same, left in `k` and `v` (which must outlive it). With a `slab`, `k` and `v` hold only
// some positions of row `batchRow` (format/paged_kv.h): those are present, the rest absent, and
// the checks are made on the stored shape the slab gives.
LayerSource alignReferenceSource(const RawTensor& k, const RawTensor& v, std::int64_t batchRow,
                                 const KvCacheConfig& config, const KvCacheGroup& group, std::int64_t targetLen,
                                 const std::string& file, const std::string& object,
                                 const std::optional<ReferenceSlab>& slab = std::nullopt);

// The reference positions [first, end) that hold the engine positions `window` of a sequence
// of `targetLen`, for a reference of `seq` positions (aligned as above: at the end).
PositionRange referenceRowsFor(PositionRange window, std::int64_t seq, std::int64_t targetLen);

}  // namespace kvscope
