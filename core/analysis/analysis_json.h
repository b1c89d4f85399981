#pragma once
// The analysis as strict JSON (schema: docs/analysis-json.md). NaN ("no data") is written as
// null, never as a bare NaN; base_* metrics and BC appear only for three-way prompts.

#include "analysis/analysis_result.h"

#include <ostream>
#include <string>

namespace kvscope {

void writeAnalysisJson(const AnalysisResult& result, std::ostream& out);

// A JSON string literal, quotes included. Bytes that are not UTF-8 (names come from files) are
// written as the text \xNN, so the JSON stays valid; all else is kept exactly.
std::string jsonString(const std::string& text);

}  // namespace kvscope
