#pragma once
// The analysis JSON's `states` of a prompt (docs/analysis-json.md): each state-space layer's
// checkpoints, and per part and checkpoint its cells' metrics, floors and ratios.
#include "analysis/state_analysis.h"
#include "util/json_writer.h"
#include <vector>

namespace kvscope {

void writeStates(JsonWriter& w, const std::vector<StateLayerAnalysis>& states);

}  // namespace kvscope
