#pragma once
// The rows of a prompt's state-space layers under its map (analysis/state_analysis.h): one per
// layer in the model's order, a cell per checkpoint at the last position the state absorbed
// (a state after [0, p) sits at token p - 1), its value the worst cell's ratio over the layer's
// off threshold, as the map's ratio scale draws every row; and what a cell says in words.
#include "analysis/analysis_result.h"
#include <cstdint>
#include <string>
#include <vector>

namespace kvscope {

struct StateRowCell {
    std::int64_t token = 0;       // the checkpoint's position - 1
    std::size_t checkpoint = 0;
    double offs = 0;              // the worst cell's ratio / the off threshold (NaN: nothing finite)
};

struct StateRow {
    std::string layer;
    std::string label;  // "model.layers.2 [ssm]" (Mamba), "[gdn]" (Gated DeltaNet), "[state]"
    std::string problem;  // not compared, and why (no cells then)
    std::vector<StateRowCell> cells;
};

std::vector<StateRow> stateRows(const PromptAnalysis& p);
// The cell of `row` nearest `token` within `reach` tokens (nullptr: none).
const StateRowCell* stateCellNear(const StateRow& row, std::int64_t token, std::int64_t reach);
// "model.layers.2.mixer, the state after position 16: 214 floors (off above 6): ssm heads 5 (214),
// 7 (120), ...; conv channels 0-11 (140), ..." (each part's cells, worst first, those off and
// the worst one else).
std::string stateCellText(const StateLayerAnalysis& a, std::size_t checkpoint);

}  // namespace kvscope
