#pragma once
// Whether a KV error matters: the impact records a bundle holds (format/impact_record.h), summed
// up per transplant over prompts' decode steps, said for each suspect (the engine's KV from its
// onset on, against the baseline's there: what bf16 noise does), and per layer for the views.

#include "analysis/analysis_result.h"
#include "kv/capture_loader.h"

#include <optional>
#include <string>
#include <vector>

namespace kvscope {

// Each prompt's record (PromptAnalysis::impact); a broken one becomes a problem of its prompt.
void readImpacts(const CaptureLoader& loader, std::vector<PromptAnalysis>& prompts);

// `transplant`'s figures over the decode steps of the prompts `ids` whose record holds it
// (nullopt: none does).
std::optional<ImpactFigures> impactFigures(const std::vector<PromptAnalysis>& prompts, const std::vector<std::string>& ids,
                                           const Transplant& transplant);

// Says what each suspect does to the output where its prompts' records measured it (a state
// suspect's layer is never replaced: none).
void attachImpact(std::vector<Suspect>& suspects, const std::vector<PromptAnalysis>& prompts);

// One attention layer's rows: the engine's KV in it alone and from it on, and the baseline's
// in the same layers (the noise each is measured against).
struct LayerImpact {
    std::string layer;
    std::optional<ImpactFigures> alone, aloneNoise, from, fromNoise;
};
// Per layer of `layers` (those no record holds have none), over the prompts `ids`.
std::vector<LayerImpact> layerImpacts(const std::vector<PromptAnalysis>& prompts, const std::vector<std::string>& ids,
                                      const std::vector<std::string>& layers);

// A KL in nats to 2 significant digits ("0.0029", "0.81", "3.2e-05").
std::string klText(double kl);
// A ratio of two KLs, as every view says it: "400", "36", "5.1", "0.9".
std::string ratioText(double ratio);
// "changes the next token at 8 of 120 decode steps (KL median 0.00044, up to 0.0029 nats)"
std::string impactFiguresText(const ImpactFigures& figures);

}  // namespace kvscope
