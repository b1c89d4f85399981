#pragma once
// Merging the engine snapshots of a teacher-forced validation loop into one cache.
//
// Each generate call returns a snapshot. Snapshot i contributes the positions
// [validatedUntil(i-1), validatedUntil(i)) (snapshot 0 from position 0, so it brings the
// prompt). validatedUntil is exclusive: at a divergence d, the snapshot that produced the
// wrong token stops at d, and position d comes from the next snapshot, which re-prefilled
// the teacher token there. Positions no snapshot wrote stay absent, never zero; in
// particular the last position (the last sampled token, whose KV the engine never writes).

#include "kv/layer_source.h"
#include "kv/position_range.h"

#include <cstdint>
#include <string>
#include <vector>

namespace kvscope {

struct SnapshotSpan {
    std::int64_t seqLen = 0;          // sequence length when the snapshot was taken
    std::int64_t validatedUntil = 0;  // exclusive end of the positions this snapshot validates
};

// The range each snapshot contributes. Throws BundleError (naming `file`/`object`) when
// validatedUntil decreases or exceeds the snapshot's seqLen.
std::vector<PositionRange> contributedRanges(const std::vector<SnapshotSpan>& spans,
                                             const std::string& file = {}, const std::string& object = {});

// Builds the merged cache of length `totalLen` from the snapshots' sources: each position's
// runs come from the snapshot that contributes it (nothing is copied but where they lie).
class SnapshotMerger {
public:
    SnapshotMerger(int heads, std::int64_t totalLen, HeadDims dims, int runsPerRow);
    // Takes the present positions of `snapshot` within `range` (clipped to what it holds),
    // and shares what keeps its tensors alive.
    void add(const LayerSource& snapshot, PositionRange range);
    LayerSource take() { return std::move(m_merged); }

private:
    LayerSource m_merged;
};

}  // namespace kvscope
