#pragma once
// The cells a user should look at first: (layer, token) cells ranked by how far the engine
// is from the reference in noise floors, the number the map colours (heatmap_grid.h's
// ErrorRatio), so that dtype noise ranks low however large it is. Three-way: the cell's error
// ratio (its worst head's relative L-inf over the cell's expected-vs-baseline L-inf,
// analysis_result.h); two-way: the worst head's relative L2 over the cell's floor (the cache
// dtype's rounding, off_floor.h's cellFloor). A NaN or infinity comes first, whatever the floor.

#include "analysis/analysis_result.h"

#include <string>
#include <vector>

namespace kvscope {

struct WorstCell {
    int layer = 0;
    std::int64_t token = 0;
    int head = 0;  // the worst head, whose numbers these are
    KvPart part = KvPart::K;
    float error = 0;      // the head's error, engine vs reference: relative L-inf (three-way) or L2 (two-way)
    float baseError = 0;  // the cell's noise floor (three-way: max base relative L-inf over heads)
    float ratio = 0;      // error / baseError, in floors: the ranking key
    // A NaN or infinity in an input (PromptAnalysis::nonFinite): listed before every finite
    // cell, ratio +inf, error NaN (NaN) or +inf (infinity), baseError NaN; `side` says which
    // input holds it ("actual", "expected", "baseline").
    bool nonFinite = false;
    std::string side{};
    std::string value{};  // "nan", "inf", "-inf" (empty: not said)
};

// How a non-finite cell is shown: "NaN", "inf", "-inf" ("NaN/inf" when not said), and with
// the side: "NaN (engine)", "inf (expected)".
std::string nonFiniteText(const WorstCell& cell);
std::string nonFiniteSideText(const WorstCell& cell);

// The statistic of WorstCell::error, in words: "relative L-inf" (three-way) or "relative L2".
const char* worstCellStatistic(const PromptAnalysis& prompt);

// At most `count` cells, worst first: the non-finite ones (layer, token order), then by ratio;
// at most one entry per (layer, token) (its worse part; a non-finite one: its first cell, the
// engine's first).
// `layersReady` (optional, per layer): only those layers (a cancelled analysis may have
// written part of another).
std::vector<WorstCell> worstCells(const PromptAnalysis& prompt, std::size_t count,
                                  const std::vector<char>* layersReady = nullptr);

}  // namespace kvscope
