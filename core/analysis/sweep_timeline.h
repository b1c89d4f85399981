#pragma once
// A soak run over time: corruption that builds up under load (a disaggregated transfer that
// fails more as the queue fills, a cache that degrades as blocks are reused) shows as a
// per-capture statistic rising against capture time. For a sweep (many bundles) a point is a
// bundle, placed at its recorded capture time (the bundle's `created`) or, where not every
// bundle recorded a distinct time, at its index in the sweep; for one bundle of many prompts a
// point is a prompt, at its request index (the bundle's prompt order).
//
// Each point's statistics are the map's: a (layer, token) cell's ratio in floors, the largest
// over heads (cellRatioMaxima), and "off" above the layer's threshold (finalMapOffThresholds).

#include "analysis/analysis_result.h"
#include "analysis/heatmap_grid.h"
#include "analysis/map_spec.h"
#include "analysis/suspect.h"

#include <cmath>
#include <optional>
#include <string>
#include <vector>

namespace kvscope {

struct TimelinePoint {
    std::string name;      // the bundle's name, or the prompt's id
    std::string created;   // the bundle's recorded time (empty: none; prompts: their bundle's)
    double x = 0;          // seconds since the first point's time, or the index
    int prompts = 0;       // analysed prompts it holds
    float worstRatio = std::nanf("");  // the largest cell ratio over its prompts (NaN: no data)
    double offFraction = std::nan("");  // its off cells over its cells with data
    int suspects = 0;      // its prompts with a suspect
    // [layer of SweepTimeline::layers]: its worst cell over the layer's off threshold (1: at it),
    // the largest over its prompts; NaN: no data. The "Over time" map's cells.
    std::vector<float> layerOff;
};

struct SweepTimeline {
    bool perBundle = true;  // points are bundles (a sweep), else prompts of one bundle
    bool byTime = false;    // x is seconds since the first capture, else the index
    std::vector<TimelinePoint> points;
    std::vector<std::string> layers;  // the first prompt's analysed layers (a sweep is of one model)
    // Spearman's rank correlation of the worst ratio with x (NaN under 3 points), and the
    // sentence that says a trend where there is one (empty otherwise).
    double rankCorrelation = std::nan("");
    std::string trend;
};

// Null when there is nothing to plot: a sweep of fewer than two bundles, one bundle of fewer
// than five prompts (a few prompts of one capture are no soak run).
std::optional<SweepTimeline> sweepTimeline(const AnalysisResult& result, const SuspectThresholds& thresholds);

// The "Over time" map: layers x points (in order), each cell the layer's worst cell in that
// capture over its off threshold (TimelinePoint::layerOff): already in the units of
// ScaleKind::Ratio, a layer that degrades under load a row that turns loud.
HeatmapGrid timelineGrid(const SweepTimeline& timeline);
MapSpec timelineMapSpec(const SweepTimeline& timeline);

// Seconds since the epoch of an ISO 8601 UTC time ("2026-11-30T17:35:46Z", fractions and a
// "+00:00" offset allowed); none when it is not one.
std::optional<double> isoSeconds(const std::string& text);

// Spearman's rank correlation (ties share their mean rank); NaN under 3 pairs or with no spread.
double spearman(const std::vector<double>& x, const std::vector<double>& y);

}  // namespace kvscope
