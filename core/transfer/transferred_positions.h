#pragma once
// Which positions of a prompt were transferred at all: those both captures hold (compared),
// those the producer holds and the consumer lacks (missing), the consumer's blocks that hold
// only some of what the producer's held (partial), and what only the consumer holds (extra:
// decoded there, for instance). A consumer that records provenance (format/provenance.h) had
// its transferred positions loaded by a connector (`external`); what both hold but the consumer
// computed itself is listed apart (local) and not compared: its values need not be the same bits.

#include "kv/position_range.h"
#include "transfer/layer_blocks.h"

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace kvscope {

struct ProvenanceRange;

// A consumer block that received only part of the producer's positions of its block.
struct PartialBlock {
    std::int64_t block = 0;                    // the block-table entry (position / block_size)
    std::int64_t producerBlock = -1, consumerBlock = -1;  // physical ids (-1: null)
    PositionRange positions;                   // the producer's positions of the block
    std::vector<PositionRange> arrived;        // those the consumer holds
};

struct TransferredPositions {
    std::vector<PositionRange> transferred;  // compared: held by both (and loaded by a connector, where recorded)
    std::vector<PositionRange> missing;      // held by the producer only
    std::vector<PositionRange> extra;        // held by the consumer only
    std::vector<PositionRange> local;        // held by both, but computed by the consumer (provenance)
    std::vector<PartialBlock> partial;
    std::int64_t transferredCount() const;
};

// Whether a position both hold is compared: without provenance every one; with it, those an
// external connector loaded.
std::vector<std::uint8_t> comparedMask(const LayerBlocks& producer, const LayerBlocks& consumer,
                                       const std::vector<ProvenanceRange>& consumerProvenance);

TransferredPositions classifyPositions(const LayerBlocks& producer, const LayerBlocks& consumer,
                                       const std::vector<ProvenanceRange>& consumerProvenance);

// Runs of set flags as ranges.
std::vector<PositionRange> rangesOf(const std::vector<std::uint8_t>& flags);

}  // namespace kvscope
