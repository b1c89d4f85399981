#pragma once
// A synthetic hybrid model's recurrent state in its capture (model_capture.cpp): the options a
// hybrid model implies, where the checkpoints fall, the Mamba2 state as vLLM shards it over TP
// ranks and as the references hold it (docs/bundle-format.md, "Recurrent state"), and where a
// state fault strikes. Internal to the synthetic generator.

#include "format/recurrent_state.h"
#include "synth/model_capture.h"
#include "synth/tiny_transformer.h"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace kvscope::synth {

// A Mamba2 layer's name, as vLLM names Nemotron-H's: model.layers.N.mixer.
std::string mixerLayerName(int layer);

// `o` with a hybrid model's defaults made explicit: the state-space layers (default: the even
// ones) as shape.mambaLayers, a checkpoint every fullBlockSize positions (the MambaSpec group's
// block size). Unchanged without `hybrid`.
ModelCaptureOptions withHybridDefaults(ModelCaptureOptions o);
// Throws std::invalid_argument for a hybrid model vLLM could not shard over the TP ranks (heads
// and, unless there is one group, the B/C groups divided evenly), an MLA hybrid, or a state
// fault without a hybrid model. Takes withHybridDefaults' result.
void checkHybridOptions(const ModelCaptureOptions& o);

// The checkpoints of a run that has absorbed `positions` tokens: every multiple of `every`
// up to it, and `positions` itself.
std::vector<std::int64_t> checkpointPositions(std::int64_t positions, std::int64_t every);

// Where a state fault strikes: one Mamba2 layer of one prompt, after `position` tokens (a
// checkpoint), the engine running on from the wrong state.
struct StateFaultPlan {
    FaultKind kind = FaultKind::None;
    int layer = -1;
    std::size_t prompt = 0;
    std::int64_t position = 0;
    std::int64_t source = 0;  // state_stale: the checkpoint whose state it holds
    float factor = 1.0f;      // state_not_reset: the leftover's; state_scale: the state's
    bool needsOtherPrompt() const
    {
        return kind == FaultKind::StateOtherRequest || kind == FaultKind::StateNotReset;
    }
    nlohmann::json truth;  // the bundle's synthetic_fault
};
// Throws std::invalid_argument when the fault cannot be placed (the layer is not a Mamba2 layer,
// one prompt where it needs two, no checkpoint at or after the fault step).
StateFaultPlan planStateFault(const ModelCaptureOptions& o);
// The engine faults of the plan's prompt. `source` is prompt_0's engine run over its
// `sourceEnd` positions (its prompt and teacher tokens but the last), for the kinds that take
// another prompt's state; empty otherwise.
void addStateFault(const StateFaultPlan& plan, const TinyTransformer& model, const std::vector<LayerCache>& source,
                   std::int64_t sourceEnd, EngineFaults& faults);

// Mamba2 layer `layer`'s states at `positions` from an engine run's cache, per TP rank as vLLM
// shards them: rank r holds the x channels and heads r x (count / tp) onwards, and its heads' B
// and C groups (groups / tp of them, or the one group on every rank); conv in bf16, the SSM
// state in fp32 (bf16 with Mamba2Shape::engineStateBf16).
LayerStateRecord engineStateRecord(const TinyTransformer& model, const std::vector<LayerCache>& cache, int layer,
                                   const std::vector<std::int64_t>& positions, const EngineFaults& faults, int tpSize);
// The same states whole, as a reference holds them: HF's cache in bf16 (expected), fp32 (baseline).
LayerStateRecord referenceStateRecord(const TinyTransformer& model, const std::vector<LayerCache>& cache, int layer,
                                      const std::vector<std::int64_t>& positions, Numerics numerics);

}  // namespace kvscope::synth
