#include "analysis/worst_prompt.h"

#include <cmath>

namespace kvscope {

std::optional<PromptCell> worstPromptAt(const std::vector<PromptAnalysis>& prompts, KvPart part, int layer,
                                        std::int64_t generation)
{
    std::optional<PromptCell> worst;
    float worstBc = std::nanf("");
    for (std::size_t i = 0; i < prompts.size(); ++i) {
        const PromptAnalysis& p = prompts[i];
        const std::int64_t token = p.promptLen + generation;
        if (!p.threeWay || layer < 0 || layer >= int(p.layers.size()) || generation < 0 || token >= p.tokens)
            continue;
        const float bc = p.bcVsNoiseValue(part, layer, token);
        // NaN compares false: a NaN never replaces, and anything replaces a NaN.
        if (!worst || (!std::isnan(bc) && (std::isnan(worstBc) || bc < worstBc))) {
            worst = PromptCell{int(i), token};
            worstBc = bc;
        }
    }
    return worst;
}

}  // namespace kvscope
