#pragma once
// The analysis as strict JSON (schema: docs/analysis-json.md), by util/json_writer.h's rules:
// NaN ("no data") is written as null, never as a bare NaN; base_* metrics and BC appear only
// for three-way prompts. Its fields other than the per-cell arrays are analysis_fields.h's.

#include "analysis/analysis_result.h"
#include "analysis/suspect.h"

#include <ostream>

namespace kvscope {

// `thresholds`: the suspects' (the off level of a prompt's `sources`, analysis/source_summary.h).
void writeAnalysisJson(const AnalysisResult& result, std::ostream& out, const SuspectThresholds& thresholds = {});

}  // namespace kvscope
