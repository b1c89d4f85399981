#pragma once
// What a layer x token heatmap shows, computed from an analysis: one value per (layer,
// token) for a chosen metric, K or V, and reduction over heads, with the head it came from;
// and its downsampling for display, which keeps the worst value of each pooled run so that
// nothing bad disappears when zoomed out. NaN = no data.

#include "analysis/analysis_result.h"

#include <cstdint>
#include <string>
#include <vector>

namespace kvscope {

enum class HeatmapMetric {
    RelLinf,      // relative L-inf of actual vs reference
    RelL2,        // relative L2
    OneMinusCos,  // 1 - cosine similarity
    ErrorRatio,   // the cell's error in floors, as the suspects take it (off_floor.h): three-way actual
                  // L-inf / what bf16 alone does there; two-way relative L2 / the dtype's rounding
    Bc,           // three-way: the reference tool's Bhattacharyya coefficient (per layer and token)
    BcVsNoise,    // three-way: BC against the noise floor (metrics/bc_vs_noise.h), the default BC
};
enum class HeadReductionKind { Max, Mean, OneHead };

struct HeatmapSpec {
    HeatmapMetric metric = HeatmapMetric::RelLinf;
    KvPart part = KvPart::K;
    HeadReductionKind reduction = HeadReductionKind::Max;
    int head = 0;  // for OneHead
    bool operator==(const HeatmapSpec&) const = default;
};

// Whether low values are the bad ones (BC): then pooling keeps the minimum.
bool lowerIsWorse(HeatmapMetric metric);
std::string heatmapMetricName(HeatmapMetric metric);
// For menus: "relative L-inf", ..., "error ratio (3-way)", "BC (3-way)".
std::string heatmapMetricShortName(HeatmapMetric metric);

struct HeatmapGrid;
// Each row's values divided by byRow[firstRow + row] (a map in floors drawn in units of each
// layer's off threshold: map_spec.h's ScaleKind::Ratio).
void divideRows(HeatmapGrid& grid, const std::vector<double>& byRow, int firstRow = 0);

struct HeatmapGrid {
    int rows = 0;              // layers
    std::int64_t columns = 0;  // tokens (or pooled runs of tokens)
    std::int64_t firstToken = 0;
    std::int64_t tokensPerColumn = 1;
    std::vector<float> values;       // [row][column]
    std::vector<std::int16_t> heads;  // the head behind each value (-1: none / not per head)

    float at(int row, std::int64_t column) const { return values[std::size_t(row) * std::size_t(columns) + std::size_t(column)]; }
    std::int16_t headAt(int row, std::int64_t column) const
    {
        return heads[std::size_t(row) * std::size_t(columns) + std::size_t(column)];
    }
};

// The value of one cell (and its head), as the heatmap shows it.
float heatmapValue(const PromptAnalysis& p, const HeatmapSpec& spec, int layer, std::int64_t token, int* head = nullptr);
// For the error metrics of a three-way prompt, the same value of the base (expected vs
// baseline: the dtype noise) at that cell; NaN otherwise.
float heatmapBaseValue(const PromptAnalysis& p, const HeatmapSpec& spec, int layer, std::int64_t token);

// `rowsReady` (optional, per layer): rows not yet analysed stay NaN and are not read (the
// analysis may still be writing them).
HeatmapGrid buildHeatmap(const PromptAnalysis& p, const HeatmapSpec& spec, const std::vector<char>* rowsReady = nullptr);
// The start of one layer's row, tokens [0, tokens) (clipped to the prompt's): one row, one
// column a token. For a layer still being analysed (AnalysisOptions::windowDone).
HeatmapGrid heatmapRowStart(const PromptAnalysis& p, const HeatmapSpec& spec, int layer, std::int64_t tokens);

// Columns [first, last) of `grid` in runs of `run` columns: the worst defined value of each run
// (max, or min where lower is worse), with its head; NaN and head -1 where the run has no data.
HeatmapGrid poolRuns(const HeatmapGrid& grid, std::int64_t first, std::int64_t last, std::int64_t run, bool lowerWorse);
// Columns [from, to) of `grid` pooled into at most `maxColumns` columns, each the worst of
// its run (max, or min where lower is worse); NaN only where the whole run has no data.
HeatmapGrid poolColumns(const HeatmapGrid& grid, std::int64_t from, std::int64_t to, std::int64_t maxColumns,
                        bool lowerWorse);

// The aggregated BC across prompts: layers x generation indices; against the noise floor, or
// the reference tool's. Against the noise floor with too few values at an index
// (generationBcMeaningful), every cell is NaN: nothing to draw, as the prompt page leaves a
// token's BC out.
HeatmapGrid aggregateHeatmap(const AnalysisResult& result, KvPart part, bool vsNoise = true);

}  // namespace kvscope
