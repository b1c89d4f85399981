#pragma once
// The analysis JSON's impact (docs/analysis-json.md): a suspect's `impact`, written and read back
// (results files keep suspects), and a prompt's measured rows as the bundle holds them.
#include "analysis/analysis_result.h"
#include "format/json_fields.h"
#include "util/json_writer.h"

#include <optional>
#include <string>

namespace kvscope {

// Nothing where the suspect has none (its JSON is then what it was before the field existed).
void writeSuspectImpact(JsonWriter& w, const std::optional<SuspectImpact>& impact);
std::optional<SuspectImpact> readSuspectImpact(const JsonFields& f, const JsonFields::Json& suspect, const std::string& at);
// {"computed_by", "steps", "rows": [{"transplant": {...}, "kl": [...], "top1_changed": [...]}]}
void writePromptImpact(JsonWriter& w, const ImpactRecord& record);
// The prompt's "impact" read back (a results file keeps it), checked as the bundle's reader checks it.
std::optional<ImpactRecord> readPromptImpact(const JsonFields& f, const JsonFields::Json& prompt, const std::string& at);

}  // namespace kvscope
