#pragma once
// The analysis split by where each position's KV came from (format/provenance.h): per source
// (a prefill chunk, the prefix cache, one connector, decode, ...) how many of its cells are
// off the noise floor, its worst cell, and per layer its worst ratio. A fault of one path (a
// connector's load, a later prefill chunk) shows as one source off and the others quiet.
//
// "Off" is what the map paints off: a (layer, token) cell's ratio in floors, the largest over
// heads (cellRatioMaxima), above its layer's threshold (finalMapOffThresholds, off_floor.h).

#include "analysis/analysis_result.h"
#include "analysis/off_floor.h"
#include "format/provenance.h"

#include <cmath>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace kvscope {

struct SourceSummary {
    std::string source;  // "prefill (chunk 2)", "prefix_cache", "external (NixlConnector)", "decode", ...
    ProvenanceKind kind = ProvenanceKind::Unknown;
    std::vector<std::pair<std::int64_t, std::int64_t>> spans;  // its analysed positions, runs [start, end)
    std::int64_t positions = 0;
    std::int64_t cells = 0;     // (layer, token, K/V) cells with data
    std::int64_t offCells = 0;  // of them above their layer's off threshold
    std::int64_t nonFinite = 0; // values of its positions holding NaN or infinity (PromptAnalysis::nonFinite)
    float worstRatio = std::nanf("");  // NaN: no cell with data
    int worstLayer = -1;
    std::int64_t worstToken = -1;
    KvPart worstPart = KvPart::K;
    std::vector<float> layerWorst;  // [layer]: the largest ratio over its positions (NaN: none)
};

// The source a range belongs to: prefill chunks and recomputations after each preemption apart,
// each connector apart, every other kind one source.
std::string sourceOf(const ProvenanceRange& range);

// One entry a source, in the order of their first positions; positions no range covers are
// "unknown". Empty when `provenance` is. `offThresholds`: per layer (finalMapOffThresholds);
// `ratios`: the prompt's cellRatioMaxima when the caller has them already (else computed here).
std::vector<SourceSummary> summarizeBySource(const PromptAnalysis& p, const std::vector<ProvenanceRange>& provenance,
                                             const std::vector<double>& offThresholds, const CellRatioMaxima* ratios = nullptr);

// "64-127, 200-203": the spans as the text output and the app say them.
std::string spanText(const std::vector<std::pair<std::int64_t, std::int64_t>>& spans);

}  // namespace kvscope
