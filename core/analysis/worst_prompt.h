#pragma once
// From a cell of the across-prompts map to one prompt: that map pools every three-way prompt
// at a generation index (a position counted from the end of each prompt), so a click asks
// "in which prompt is this cell worst?". Worst is the lowest BC against the noise floor, as
// the map shows it.

#include "analysis/analysis_result.h"

#include <cstdint>
#include <optional>
#include <vector>

namespace kvscope {

struct PromptCell {
    int prompt = 0;           // index into the prompts
    std::int64_t token = 0;   // absolute: the prompt's length + the generation index
};

// Among the three-way prompts that have `layer` and a token at `generation` past their
// prompt: the one with the lowest BC vs noise for `part` there. A prompt without a value there
// (NaN) loses to any that has one; the first wins ties, and stands when none has a value.
// Nothing when no prompt reaches that far.
std::optional<PromptCell> worstPromptAt(const std::vector<PromptAnalysis>& prompts, KvPart part, int layer,
                                        std::int64_t generation);

}  // namespace kvscope
