#pragma once
// A state-space layer's recurrent state compared (docs/suspects.md, "Recurrent state"): per
// part, checkpoint and unit (a head of the SSM state, a channel of the conv state) the
// reference tool's relative L2, relative L-inf and 1 - cos of the engine against expected, and
// the cell's ratio in floors, from the same absolute floors as the KV's:
// - three-way: its relative L2 against the baseline over what bf16 alone does there (expected
//   against the baseline), at least what it does to the part's typical unit at that checkpoint
//   (a conv unit is a few values, whose own rounding may by chance be next to none) and a
//   quarter of the model dtype's unit roundoff;
// - two-way: its relative L2 against expected over the model dtype's unit roundoff.
// A state is a running sum, but a decaying one: its rounding error grows with the positions it
// has absorbed only up to its memory (docs/suspects.md gives the growth measured on clean
// captures), which the off threshold allows for as the KV's two-way drift does.
#include "analysis/suspect.h"
#include "format/dtype.h"
#include "format/kv_cache_config.h"
#include "kv/layer_state.h"
#include <cstdint>
#include <string>
#include <vector>

namespace kvscope {

struct StatePartAnalysis {
    std::string name;
    std::int64_t units = 0;         // cells per checkpoint
    std::int64_t unitsPerCell = 1;  // the format's units in a cell (groupSmallUnits)
    DType engineDType = DType::Float32;
    // [checkpoint][unit]; NaN where a side is not finite.
    std::vector<float> relL2, relLinf, oneMinusCos;
    std::vector<float> baseRelL2;  // three-way: expected against the baseline
    std::vector<float> floor;      // the cell's floor (relative L2)
    std::vector<float> ratio;      // in floors
    std::vector<float> sizeRatio;  // the engine's L2 norm over expected's: direction kept, size off?
    float at(const std::vector<float>& metric, std::size_t checkpoint, std::int64_t unit) const
    {
        return metric[checkpoint * std::size_t(units) + std::size_t(unit)];
    }
};

// A value that is not finite in a state (the engine's or a reference side's).
struct StateNonFinite {
    std::string part;
    std::int64_t position = 0;  // the checkpoint's
    std::int64_t unit = 0;
    std::string side;  // "actual", "expected", "baseline"
};

struct StateLayerAnalysis {
    std::string layer;
    std::string kind;
    int modelIndex = 0;  // its place among all the model's layers (modelLayerOrder)
    std::vector<std::int64_t> positions;   // the checkpoints compared (the state after [0, p))
    std::vector<std::int64_t> uncompared;  // the engine's checkpoints the reference lacks
    bool threeWay = false;
    double unitRoundoff = 0;    // of the model dtype the floors are in
    double offThreshold = 0;    // in floors: a cell above it is off
    std::vector<StatePartAnalysis> parts;
    std::vector<StateNonFinite> nonFinite;
    std::vector<StateReplicaDifference> replicaDifferences;
    std::string problem;  // the state could not be compared (then nothing else is set)

    // The worst cell at a checkpoint, over parts and units (NaN: none), with where it is.
    float worstRatio(std::size_t checkpoint, int* part = nullptr, std::int64_t* unit = nullptr) const;
    // Cells above the off threshold at a checkpoint, over parts and units.
    int offCells(std::size_t checkpoint) const;
    std::int64_t cells() const;
};

// Every layer of the config (attention and state-space) in the model's order: by the number
// after "layers." in its name, else in the config's order; what state rows and onsets sort by.
std::vector<std::string> modelLayerOrder(const KvCacheConfig& config);

// Each part's units in runs of consecutive units (a divisor of their count) holding at least
// kStateCellValues values: a conv channel holds d_conv - 1 values, too few for a relative error
// of its own to tell rounding from a fault (cancellation leaves some with next to no size).
// A pure reshape of the values (consecutive units are contiguous).
inline constexpr std::int64_t kStateCellValues = 32;
void groupSmallUnits(LayerState& state);

// The comparison of `state` (its units grouped already); `testedCells`: the state cells of the whole prompt, which the off
// threshold grows with (as the KV's does with its cells).
StateLayerAnalysis analyzeLayerState(const LayerState& state, int modelIndex, const SuspectThresholds& thresholds,
                                     std::int64_t testedCells);

class CaptureLoader;
struct PromptInfo;
// Every state layer of a prompt (PromptInfo::stateLayers) compared, in the model's order; a
// layer whose state cannot be read or does not match the reference is kept with its problem.
std::vector<StateLayerAnalysis> analyzePromptStates(const CaptureLoader& loader, const PromptInfo& prompt,
                                                    const std::vector<std::string>& modelOrder,
                                                    const SuspectThresholds& thresholds);

}  // namespace kvscope
