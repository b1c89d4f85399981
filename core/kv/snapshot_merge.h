#pragma once
// Merging the engine snapshots of a teacher-forced validation loop into one cache.
//
// Each generate call returns a snapshot. Snapshot i contributes the positions
// [validatedUntil(i-1), validatedUntil(i)) (snapshot 0 from position 0, so it brings the
// prompt). validatedUntil is exclusive: at a divergence d, the snapshot that produced the
// wrong token stops at d, and position d comes from the next snapshot, which re-prefilled
// the teacher token there. Positions no snapshot wrote stay absent, never zero; in
// particular the last position (the last sampled token, whose KV the engine never writes).

#include "kv/layer_kv.h"

#include <cstdint>
#include <string>
#include <vector>

namespace kvscope {

struct SnapshotSpan {
    std::int64_t seqLen = 0;          // sequence length when the snapshot was taken
    std::int64_t validatedUntil = 0;  // exclusive end of the positions this snapshot validates
};

struct PositionRange {
    std::int64_t begin = 0;
    std::int64_t end = 0;
};

// The range each snapshot contributes. Throws BundleError (naming `file`/`object`) when
// validatedUntil decreases or exceeds the snapshot's seqLen.
std::vector<PositionRange> contributedRanges(const std::vector<SnapshotSpan>& spans,
                                             const std::string& file = {}, const std::string& object = {});

// Builds the merged cache of length `totalLen`, one snapshot at a time, so that only one
// snapshot's reconstruction is alive at once.
class SnapshotMerger {
public:
    SnapshotMerger(int heads, std::int64_t totalLen, int headDim);
    // Takes the present positions of `snapshot` within `range` (clipped to what it holds).
    // The first snapshot with the merged length is adopted rather than copied.
    void add(LayerKv&& snapshot, PositionRange range);
    void add(const LayerKv& snapshot, PositionRange range);
    LayerKv take();

private:
    int m_heads;
    std::int64_t m_totalLen;
    int m_headDim;
    bool m_started = false;
    LayerKv m_merged;
};

}  // namespace kvscope
