#pragma once
// The what-if's result as JSON (docs/analysis-json.md, "What-if").

#include "quant/impact_recipe.h"
#include "quant/whatif.h"

#include <ostream>

namespace kvscope {

// `maps`: also each scheme's layer x token maps (large for long prompts). `impact`: the scores by
// output KL and the recipe, where the bundle measured them (key "impact").
void writeWhatIfJson(const WhatIfResult& result, std::ostream& out, bool maps = false,
                     const ImpactRecipe* impact = nullptr);

}  // namespace kvscope
