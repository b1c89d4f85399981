#pragma once
// The producer's and the consumer's blocks of one layer of one prompt compared, position by
// position within each block-table entry (the physical ids differ between the engines): bit for
// bit, or, for a part the consumer stores in another dtype (a declared conversion), within the
// coarser format's rounding. What changed is gathered per block.

#include "format/dtype.h"
#include "kv/position_range.h"
#include "transfer/layer_blocks.h"

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace kvscope {

// How a consumer's value is judged against what it should be.
struct ValueJudge {
    std::optional<DType> format;  // a declared conversion's format; none: the same bits

    // `expected` and `actual` the same: equal bits (NaN as NaN), or within `format`'s rounding
    // of `expected` at dequantisation scale `scale` (half a step: relative to the value in the
    // normal range, the smallest step times the scale below it).
    bool same(float expected, float actual, float scale) const;
};
// Half the smallest step of `dtype` at scale 1 (below its normal range): what rounding a value
// near zero can move it by.
double halfSmallestStep(DType dtype);
// `value` converted to `dtype` at dequantisation scale `scale` and back: the grid's nearest point.
float convertThrough(DType dtype, float value, float scale);

// The first changed value of a block: its position, head and part.
struct ValueAt {
    std::int64_t position = -1;
    int head = -1;
    KvPart part = KvPart::K;
};

// One block-table entry of one layer of one prompt whose compared positions differ.
struct ChangedBlock {
    std::size_t prompt = 0;  // index of the matched pair
    std::size_t layer = 0;   // index of the paired layer
    std::int64_t block = 0;  // the entry: positions [block * block_size, (block + 1) * block_size)
    std::int64_t producerBlock = -1, consumerBlock = -1;  // physical ids
    std::vector<std::int64_t> comparedPositions;  // the block's positions both hold, compared
    std::vector<std::int64_t> changedPositions;   // those that differ (some head, either part)
    std::vector<int> heads;                       // the heads that differ somewhere
    std::array<bool, 2> parts{};                  // [K/V] differs somewhere
    ValueAt first;
    double maxAbsDifference = 0;  // over the changed values (NaN against a number: infinite)

    bool wholeBlock() const { return changedPositions.size() == comparedPositions.size(); }
};

// The entries of `producer` and `consumer` whose positions flagged in `compared` differ, in
// entry order. `judges` per part.
std::vector<ChangedBlock> compareBlocks(const LayerBlocks& producer, const LayerBlocks& consumer,
                                        const std::vector<std::uint8_t>& compared, const std::array<ValueJudge, 2>& judges);

// Whether the consumer's row of (`position`, `head`, `part`) is what `expected` (a row of the
// part's width) says, judged as `judge` does at the consumer's (and producer's) row scale.
bool rowMatches(const float* expected, const LayerBlocks& consumer, std::int64_t position, int head, KvPart part,
                const ValueJudge& judge, float producerScale);

}  // namespace kvscope
