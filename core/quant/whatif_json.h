#pragma once
// The what-if's result as JSON (docs/analysis-json.md, "What-if").

#include "quant/whatif.h"

#include <ostream>

namespace kvscope {

// `maps`: also each scheme's layer x token maps (large for long prompts).
void writeWhatIfJson(const WhatIfResult& result, std::ostream& out, bool maps = false);

}  // namespace kvscope
