#pragma once
// What the app and the report say of impact (analysis/impact_summary.h), so that a layer's
// figures read the same in every view: a suspect's short form for its row, a layer's four rows
// against their noise, and whether a layer's KL is beyond what bf16 noise does.

#include "analysis/impact_summary.h"

#include <optional>
#include <string>
#include <vector>

namespace kvscope {

// A clean engine's rows stay within this many times the baseline's largest KL (docs/synth.md,
// "Impact": 2.1 measured, 4 held by tst_impact_capture); a layer beyond it is more than noise.
constexpr double kImpactNoiseFactor = 4.0;

// How many times its noise's largest KL `figures`' largest is (nullopt: no noise, or noise 0).
std::optional<double> noiseRatio(const std::optional<ImpactFigures>& figures, const std::optional<ImpactFigures>& noise);
// "5.1x" (ratioText, as the suspect's sentence says it); "-" when there is none.
std::string noiseRatioText(const std::optional<ImpactFigures>& figures, const std::optional<ImpactFigures>& noise);

// The suspect's row: "output: 4/40 steps changed, KL ≤ 0.0029 (5.1x noise)".
std::string impactShortText(const SuspectImpact& impact);

// Where a layer's KL with the engine's KV in it alone stands against the baseline's there.
enum class ImpactLevel {
    None,         // no row of the engine's KV in the layer alone
    NoNoise,      // no baseline row to measure it against (two-way)
    WithinNoise,  // at most kImpactNoiseFactor times the noise's largest KL
    AboveNoise,
};
ImpactLevel impactLevel(const LayerImpact& layer);

// A layer's figures, one line per row that the records hold: "the engine's KV in this layer
// alone: KL up to 0.0029 nats (median 0.00065), top-1 changed at 4 of 40 steps", the baseline's
// there, the ratio, then the same from the layer on.
std::vector<std::string> layerImpactLines(const LayerImpact& layer);

}  // namespace kvscope
