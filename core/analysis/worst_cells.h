#pragma once
// The cells a user should look at first: (layer, token) cells ranked by how far the engine
// is from the reference. Three-way: by the error ratio (actual error / dtype-only error),
// so that dtype noise ranks low however large it is; two-way: by the relative error itself.

#include "analysis/analysis_result.h"

#include <vector>

namespace kvscope {

struct WorstCell {
    int layer = 0;
    std::int64_t token = 0;
    int head = 0;
    KvPart part = KvPart::K;
    float error = 0;      // actual relative L-inf, max over heads
    float baseError = 0;  // the same for expected vs baseline (three-way; NaN otherwise)
    float ratio = 0;      // error / baseError (three-way; NaN otherwise)
    float score = 0;      // what the ranking used
};

// At most `count` cells, worst first; at most one entry per (layer, token) (its worse part).
std::vector<WorstCell> worstCells(const PromptAnalysis& prompt, std::size_t count);

}  // namespace kvscope
