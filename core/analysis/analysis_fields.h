#pragma once
// The fields of an analysis as JSON, each part written and read in one place: the analysis
// JSON (analysis_json.h), a results file's record (results/analysis_record.h) and kvscope
// diff's reading of an analysis (diff/diff_side.h) all go through these, so their names and
// shapes cannot drift apart. Names and order are the analysis JSON's (docs/analysis-json.md).
// Writers add their fields to the object being written; readers take them from `j` strictly
// (format/json_fields.h: a wrong or missing field is a BundleError naming it, `where` first).

#include "analysis/analysis_result.h"
#include "format/json_fields.h"

#include <optional>
#include <string>
#include <vector>

namespace kvscope {

class JsonWriter;

// A prompt's shape: id, input_ids, reference_fingerprints {expected, baseline} (baseline null
// for a two-way prompt, read as 0 per layer: what the analysis holds), mode, prompt_len,
// num_tokens, num_heads, head_dim, v_head_dim, layer_head_dims, layer_heads, part_names,
// layer_names, layer_groups. The reader checks every per-layer list against layer_names.
void writePromptShape(JsonWriter& w, const PromptAnalysis& p);
void readPromptShape(const JsonFields& f, const JsonFields::Json& j, const std::string& where, PromptAnalysis& p);

// A prompt's divergences (the analysis JSON writes its per-cell arrays after them).
void writePromptDivergences(JsonWriter& w, const PromptAnalysis& p);
void readPromptDivergences(const JsonFields& f, const JsonFields::Json& j, const std::string& where, PromptAnalysis& p);

// A prompt's other findings: suspects, replica_differences, problems, non_finite.
void writePromptFindings(JsonWriter& w, const PromptAnalysis& p);
void readPromptFindings(const JsonFields& f, const JsonFields::Json& j, const std::string& where, PromptAnalysis& p);

// The document's findings: problems, not_compared ({layer, what}), suspects (pooled).
void writeDocumentFindings(JsonWriter& w, const AnalysisResult& result);
void readDocumentFindings(const JsonFields& f, const JsonFields::Json& j, AnalysisResult& result);

// The document's aggregate (null without one): prompt_ids, layer_names, num_generation_indices,
// divergence_counts, then per BC (bc, bc_vs_noise) its rows by layer and generation index (k_bc,
// v_bc: WithPerGeneration only) and its combined values per layer (combined_k_bc, combined_v_bc).
// A results file keeps the per-generation rows as datasets instead: as JSON they took seconds
// to parse at 128k tokens.
enum class AggregateRows { WithPerGeneration, CombinedOnly };
void writeAggregateFields(JsonWriter& w, const std::optional<AggregateBc>& aggregate, AggregateRows rows);
std::optional<AggregateBc> readAggregateFields(const JsonFields& f, const JsonFields::Json& j, AggregateRows rows);

// Suspects as the analysis writes them, for the documents that list some too (kvscope diff's).
void writeSuspectsJson(JsonWriter& w, const std::vector<Suspect>& suspects);

}  // namespace kvscope
