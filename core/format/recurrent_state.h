#pragma once
// A state-space layer's recurrent state as a bundle holds it (docs/bundle-format.md, "Recurrent
// state"): named parts [checkpoints, units, ...], per TP rank on the engine's side with the
// whole-model unit of each row, whole on the reference's, and the checks both writers and the
// reader make of it.
#include "format/raw_tensor.h"
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace kvscope {

// One named part of a layer's state (Mamba2: "conv", "ssm"): [checkpoints, units, ...trailing].
struct StatePart {
    std::string name;
    RawTensor tensor;  // float32, bfloat16 or float16, no scales
    // Engine ranks: the whole-model unit (axis 1 of the reference's part) of each of tensor's
    // axis-1 rows. The reference: empty (its rows are the units, in order).
    std::vector<std::int64_t> units;
};

// What the engine's ranks, or one reference role, hold of one state-space layer for a prompt.
struct LayerStateRecord {
    std::string layer;
    std::string kind;  // "mamba2", "gated_delta_net", ... (the engine's side; free text)
    // Checkpoint i is the state after the positions [0, positions[i]): increasing, each >= 1.
    std::vector<std::int64_t> positions;
    // The engine: ranks[r] holds rank r's parts. A reference: ranks[0] holds the whole state.
    std::vector<std::vector<StatePart>> ranks;
};

// The dtypes a state may be kept in.
bool isStateDType(DType dtype);

// What is wrong with `record` on its own (empty when nothing): positions, the same part names in
// every rank, shapes [checkpoints, units, ...] with the same trailing axes, dtypes, one units
// entry per row on the engine's side (`engine`), a single rank and no units on a reference's.
std::string stateRecordProblem(const LayerStateRecord& record, bool engine);

// What is wrong with an engine record against a reference record of the same layer (empty when
// nothing): the same parts and trailing axes, units within the reference's and each held by
// some rank.
std::string stateMismatchProblem(const LayerStateRecord& engine, const LayerStateRecord& reference);

}  // namespace kvscope
