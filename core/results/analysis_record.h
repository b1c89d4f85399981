#pragma once
// Everything of an analysis but its per-cell arrays, as JSON, and back: the analysis JSON's
// fields by the same writers and readers (analysis/analysis_fields.h: the prompts' shapes,
// divergences and findings, the document's problems, not-compared layers and suspects, the
// aggregate but its BCs by generation index, arrays of the results file), and the record's
// own: the options the analysis ran with and each prompt's cache dtypes and scales. A results
// file stores it beside the arrays (docs/results-files.md). Numbers are written in their
// shortest exact form, so what is read back is bit for bit what was written.

#include "analysis/analysis_result.h"
#include "analysis/analyzer.h"
#include "format/json_fields.h"

namespace kvscope {

class JsonWriter;

// The analysis options a result depends on (not the threads, callbacks or selection).
struct RecordedOptions {
    SuspectThresholds suspects;
    bool searchSuspects = true;
    bool bc = true;
    UnreadableBlockPolicy unreadableBlocks = UnreadableBlockPolicy::MarkAbsent;
};
RecordedOptions recordedOptions(const AnalysisOptions& options);

void writeAnalysisRecord(JsonWriter& w, const AnalysisResult& result, const RecordedOptions& options);
// The result's prompts have their shapes but no arrays yet (PromptAnalysis::allocate would
// clear cacheScales: keep them across it). Throws BundleError naming the field that is wrong.
// Records of older formats are upgraded first (results/record_upgrade.h).
AnalysisResult readAnalysisRecord(const JsonFields& f, const JsonFields::Json& document, RecordedOptions& options);

}  // namespace kvscope
