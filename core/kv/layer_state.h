#pragma once
// A state-space layer's recurrent state for one prompt, ready to compare: the engine's ranks
// merged into the whole model's units (docs/bundle-format.md, "Recurrent state"), both sides
// decoded to float at the checkpoints the engine and the expected reference share. Units held
// by more than one rank are read from the first and the others compared with it, bit for bit.
#include "format/dtype.h"
#include <cstdint>
#include <string>
#include <vector>

namespace kvscope {

class BundleReader;

struct StatePartValues {
    std::string name;                   // "conv", "ssm", ...
    std::vector<std::int64_t> shape;    // [checkpoints compared, units, ...trailing]
    // The format's units in one unit of `shape` (1 as read; the analysis groups a conv state's
    // channels, each a few values, into runs: analysis/state_analysis.h).
    std::int64_t unitsPerCell = 1;
    std::vector<float> engine, expected, baseline;  // baseline empty when the bundle has none
    DType engineDType = DType::Float32;
    DType referenceDType = DType::Float32;
    std::int64_t units() const { return shape.at(1); }
    std::int64_t unitSize() const;     // values per unit of one checkpoint
    std::int64_t checkpointSize() const { return units() * unitSize(); }
};

// A rank whose copy of a replicated unit differs from the copy read.
struct StateReplicaDifference {
    std::string layer;
    std::string part;
    int rank = 0;
    int againstRank = 0;
    std::int64_t unit = 0;       // the first differing unit
    std::int64_t position = 0;   // at the first checkpoint that differs (its positions)
    int units = 0;               // differing units of this rank
    std::string describe() const;
};

struct LayerState {
    std::string layer;
    std::string kind;
    std::vector<std::int64_t> positions;  // compared checkpoints: the engine's that the expected reference has
    std::vector<std::int64_t> uncompared;  // the engine's checkpoints the expected reference lacks
    bool hasBaseline = false;  // the baseline has every compared checkpoint
    std::vector<StatePartValues> parts;
    std::vector<StateReplicaDifference> replicaDifferences;
};

// Throws BundleError (naming the object) when a side is malformed, the sides disagree on parts,
// shapes or units, or no checkpoint of the engine's is in the expected reference.
LayerState loadLayerState(const BundleReader& reader, const std::string& promptId, const std::string& layer);

}  // namespace kvscope
