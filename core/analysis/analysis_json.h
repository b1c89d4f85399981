#pragma once
// The analysis as strict JSON (schema: docs/analysis-json.md), by util/json_writer.h's rules:
// NaN ("no data") is written as null, never as a bare NaN; base_* metrics and BC appear only
// for three-way prompts.

#include "analysis/analysis_result.h"

#include <ostream>

namespace kvscope {

class JsonWriter;

void writeAnalysisJson(const AnalysisResult& result, std::ostream& out);
// Suspects as the analysis writes them (`suspects`), for the documents that list some too.
void writeSuspectsJson(JsonWriter& w, const std::vector<Suspect>& suspects);
// The prompt's divergences, non-finite cells and replica differences, as the analysis writes them.
void writeDivergencesJson(JsonWriter& w, const std::vector<Divergence>& divergences);
void writeNonFiniteJson(JsonWriter& w, const std::vector<NonFiniteCell>& cells);
void writeReplicaDifferencesJson(JsonWriter& w, const std::vector<ReplicaDifference>& differences);

}  // namespace kvscope
