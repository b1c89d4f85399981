#pragma once
// How a map is labelled and coloured, in one place for the app, the PNG and the HTML report:
// the colour scale of each metric (stops and default range), layer row labels with their
// attention kind, the prefill | decode line, divergence lines and counts, titles.

#include "analysis/heatmap_grid.h"
#include "format/capture_bundle.h"
#include "format/kv_cache_config.h"

#include <cmath>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace kvscope {

enum class ScaleKind {
    Error,  // yellow (low) to red (high), range from the data (dataRange)
    // The error in floors over each layer's off threshold (mapOffThresholds, off_floor.h), on a log
    // scale 0.1..1000: one quiet colour for noise (below half the threshold), a ramp to the
    // threshold, then a loud colour that keeps darkening, so that 10x and 1000x still differ.
    Ratio,
    Bc,     // the reference tool's BC stops, 0..1
    Change, // kvscope diff's B minus A in floors: blue (better) through white (0) to red (worse), -10..10
    // kvscope transfer's cells, three values (transfer/transfer_map.h): 0 identical (quiet), 1
    // changed and explained (orange), 2 changed and unexplained (red); range -0.5..2.5.
    Transfer,
};

struct Rgb {
    int r = 0, g = 0, b = 0;
};
struct ColorStop {
    double at = 0;  // 0..1 along the scale
    Rgb color;
};
struct ValueRange {
    double lower = 0, upper = 1;
};

ScaleKind scaleOf(HeatmapMetric metric);
const char* scaleName(ScaleKind kind);  // "error", "ratio", "bc"
const std::vector<ColorStop>& colorStops(ScaleKind kind);
ValueRange defaultRange(ScaleKind kind);
// Ratio: where the noise ends and a cell is off, in units of the off threshold.
constexpr double kNoiseShareOfOff = 0.5;
// The words of a scale's legend at the values that carry them (Ratio: "noise", "off", "10x
// off", ...; the others: none, numbers are drawn).
std::vector<std::pair<double, std::string>> legendWords(ScaleKind kind);
// What a scale with words measures, for its colour bar ("error / off threshold"); empty: nothing to add.
const char* legendTitle(ScaleKind kind);
// The colour range of a prompt's map, from its data (rows not in `rowsReady` skipped). Errors:
// 0 up to twice the 99th percentile of the dtype noise at the same cells (three-way), so that
// noise fills the lower half and a bug saturates, or up to the 99th percentile of the values
// (two-way). The ratio and BC keep their fixed ranges (a ratio of 1 is noise). On a log scale
// the lower bound is positive: the 1st percentile of the positive values (errors), 0.1 (ratio:
// 0.1..10 puts noise in the middle), 0.5 (BC). An error map's linear range is its logarithmic
// one from 0.
ValueRange dataRange(const PromptAnalysis& prompt, const HeatmapSpec& spec, bool logarithmic,
                     const std::vector<char>* rowsReady = nullptr);
// The token markers: prefill | decode (solid) and divergences (dashed), in colours no scale
// uses (every scale runs through reds, oranges and yellows), each drawn over a white outline
// so that it stays visible on any cell colour.
inline constexpr Rgb kPrefillLineColor{0, 0, 0};
inline constexpr Rgb kDivergenceLineColor{180, 0, 220};
inline constexpr Rgb kMarkerOutlineColor{255, 255, 255};

// "model.layers.3.self_attn" (HF) or "model.layers.3.self_attn.attn" (vLLM) -> "model.layers.3".
std::string shortLayerName(const std::string& layer);
// "model.layers.3 [sliding 128]", "[full]", "[chunked 8192]", "[MLA]", or "[sliding 128, cached
// as full]" / "[full, chunk 8192]" (FullAttentionSpec with a sliding window or chunk size).
std::string layerRowLabel(const KvCacheConfig& config, const std::string& layer);
// "k relative L-inf, max over heads" ("k_pe relative L-inf" for an MLA latent, one vector a token)
std::string mapMetricLabel(const HeatmapSpec& spec, const PromptAnalysis& prompt);

struct MapSpec {
    std::string title;
    std::string metricLabel;           // what a cell's value is, for tooltips
    std::string xName = "token";      // one column's unit, for tooltips
    std::string xLabel = "token";
    ScaleKind scale = ScaleKind::Error;
    ValueRange range;
    std::vector<std::string> rowLabels;   // layerRowLabel of each row
    std::vector<std::string> layerNames;  // the full names
    std::vector<std::string> tokenText;   // per token, when the bundle has it
    double prefillBoundary = std::nan("");  // x of the prefill | decode line
    std::vector<std::int64_t> divergences;
    std::vector<std::pair<std::int64_t, std::string>> topLabels;  // divergence counts "c/N"
    // The prompt's suspect: its onset layer's row, framed, and the rows of the later layers it
    // affects, dimmed and labelled spreadLabel ("spread from model.layers.2"), so that the eye
    // finds where the fault starts rather than where it is largest. -1 / empty: no suspect.
    int onsetRow = -1;
    std::vector<int> spreadRows;
    std::string spreadLabel;
    // Where each position's KV came from (the prompt's provenance): a strip under the token
    // axis. Empty: not recorded.
    std::vector<ProvenanceRange> provenance;
};

// A per-prompt map (layers x tokens), with its scale's default range (the data's is dataRange:
// it reads every cell). `withSuspect`: the onset and spread rows from prompt.suspects (which
// are written when the analysis is over: not before).
MapSpec promptMapSpec(const KvCacheConfig& config, const PromptAnalysis& prompt, const PromptInfo& info,
                      const HeatmapSpec& spec, bool withSuspect = true);
// The across-prompts BC map (layers x generation index) of `result`'s aggregate: against the
// noise floor (its title saying why nothing is drawn when an index pools too few values), or
// the reference tool's BC.
MapSpec acrossPromptsMapSpec(const KvCacheConfig& config, const AnalysisResult& result, KvPart part, bool vsNoise = true);

}  // namespace kvscope
