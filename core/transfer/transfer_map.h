#pragma once
// kvscope transfer as a map (the app's Compare page in transfer mode): one matched prompt's
// layers x positions, each cell what the consumer holds of the producer's KV there: identical,
// changed and explained by a tested hypothesis, or changed and unexplained (map_spec.h's
// ScaleKind::Transfer); positions not compared (missing, extra, computed by the consumer itself)
// have no value.

#include "analysis/heatmap_grid.h"
#include "analysis/map_spec.h"
#include "transfer/transfer_compare.h"

#include <cstdint>

namespace kvscope {

inline constexpr float kTransferIdentical = 0, kTransferExplained = 1, kTransferUnexplained = 2;

struct TransferMap {
    HeatmapGrid grid;
    MapSpec spec;
};

// `prompt`: an index into result.prompts. The changed cells are those of result.changed (the
// listed blocks: compare with TransferOptions::listedBlocks large enough to list them all).
TransferMap transferMap(const TransferResult& result, std::size_t prompt);

// The listed changed block holding (`layer`, `position`) of `prompt`, or null.
const BlockFinding* transferFindingAt(const TransferResult& result, std::size_t prompt, std::size_t layer,
                                      std::int64_t position);

}  // namespace kvscope
