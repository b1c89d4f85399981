#pragma once
// Pass/fail against thresholds, for CI pipelines (`kvscope check`) and the reports.
//
// Three-way prompts: for every layer and K/V, the layer's L-inf multiplier (the largest
// actual relative L-inf over tokens and heads, over the largest expected one: how much worse
// than dtype noise the engine gets) must not exceed maxRatio, and the combined BC of the layer
// (every prompt and token pooled; against the noise floor unless bcVsNoise is false) must
// reach minBc. Any prompt, if maxLinf is set: every
// cell's relative L-inf at most maxLinf. Inputs holding NaN/infinity always fail. With maxKl,
// the output's KL is judged instead (analysis/impact_summary.h).

#include "analysis/analysis_result.h"
#include "analysis/suspect.h"
#include "analysis/analyzer.h"

#include <optional>
#include <ostream>
#include <string>
#include <vector>

namespace kvscope {

struct Thresholds {
    double minBc = 0.9;     // the reference plugin's default
    // Which combined BC minBc judges: against the noise floor (default; the reference tool's
    // BC reads ~1 on real faults, docs/analysis-json.md), or the reference tool's.
    bool bcVsNoise = true;
    double maxRatio = 2.0;  // its default L-inf multiplier
    std::optional<double> maxLinf;
    // Output quality instead of the floors: each prompt's next-token KL (nats) with the engine's
    // KV in every layer, at every decode step (its impact record), at most this. Set, it replaces
    // the floor gates (suspects, multipliers, BC, L-inf); NaN or infinity and bundles left out
    // still fail, and so does a prompt without an impact record.
    std::optional<double> maxKl;
    // Any suspect is a violation; these say when a cell and a layer count as off the floor.
    SuspectThresholds suspects;
};

struct Violation {
    std::string prompt;  // empty for the across-prompt combined BC
    std::string layer;
    std::int64_t token = -1;  // -1: the layer as a whole
    int head = -1;
    std::string metric;
    double value = 0;
    double threshold = 0;
    std::string detail;  // a suspect's evidence; why a bundle was left out
    std::string bundle{};  // a sweep's bundle left out (unreadable, another model's): its name
};

std::vector<Violation> checkThresholds(const AnalysisResult& result, const Thresholds& thresholds);

// The verdict as strict JSON, for CI (`kvscope check --json`; docs/reports.md).
void writeVerdictJson(const std::string& bundle, const Thresholds& thresholds,
                      const std::vector<Violation>& violations, std::ostream& out);

// The analysis a verdict is given on (`kvscope check`, the report's verdict): strict, since a
// broken capture is not a pass. An unreadable block, a prompt or layer that cannot be
// analysed throws (BundleError or std::runtime_error naming it).
AnalysisResult analyzeForVerdict(const std::shared_ptr<BundleReader>& reader, AnalysisOptions options = {});
// A sweep's, as strict (its loader opened with UnreadableBlockPolicy::Error).
AnalysisResult analyzeForVerdict(const Sweep& sweep, const AnalysisOptions& options);
// Throws the first of the analysis's problems, as analyzeForVerdict does (a results file read
// for a verdict).
void requireNoProblems(const AnalysisResult& result);

}  // namespace kvscope
