#pragma once
// The cells a user should look at first: (layer, token) cells ranked by how far the engine
// is from the reference. Three-way: by the cell's error ratio (its worst head's actual error
// over the cell's dtype-only noise floor, analysis_result.h), so that dtype noise ranks low
// however large it is; two-way: by the relative L-inf of the worst head.

#include "analysis/analysis_result.h"

#include <vector>

namespace kvscope {

struct WorstCell {
    int layer = 0;
    std::int64_t token = 0;
    int head = 0;  // the worst head, whose numbers these are
    KvPart part = KvPart::K;
    float error = 0;      // the head's actual relative L-inf
    float baseError = 0;  // the cell's noise floor: max base relative L-inf over heads (three-way; NaN otherwise)
    float ratio = 0;      // error / baseError: the head's error ratio = the cell's (three-way; NaN otherwise)
    float score = 0;      // what the ranking used: ratio (three-way) or error (two-way)
};

// At most `count` cells, worst first; at most one entry per (layer, token) (its worse part).
// `layersReady` (optional, per layer): only those layers (a cancelled analysis may have
// written part of another).
std::vector<WorstCell> worstCells(const PromptAnalysis& prompt, std::size_t count,
                                  const std::vector<char>* layersReady = nullptr);

}  // namespace kvscope
