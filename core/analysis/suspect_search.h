#pragma once
// Suspects: where the engine's KV first leaves the noise floor of the capture itself, what
// kind of bug that looks like, and the evidence (docs/suspects.md). In steps: the cells off
// the floor and the layers they affect (off_floor.h); the onset, the first affected layer in
// model order and its earliest off cell (later affected layers are the spread, never a
// suspect of their own: a downstream effect is never ranked above its cause); the onset's
// off cells tested against each pattern of a closed set in order (suspect_patterns.h); the
// evidence of the first that holds, and the attribution (heads, TP ranks, blocks).

#include "analysis/analysis_result.h"
#include "analysis/off_floor.h"
#include "analysis/suspect.h"

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace kvscope {

class CaptureLoader;
struct KvCacheConfig;
class WorkTeam;

// The suspects of one analysed prompt, best first (at most one: its onset). `layersReady`
// (optional) limits the search to finished layers. With a `team`, its threads share the
// layers. With `earlier` (kvscope diff), the suspects of what got worse since that run.
std::vector<Suspect> findSuspects(const CaptureLoader& loader, const PromptAnalysis& prompt,
                                  const SuspectThresholds& thresholds = {},
                                  const std::vector<char>* layersReady = nullptr, WorkTeam* team = nullptr,
                                  const EarlierRun* earlier = nullptr);

// The non_finite suspect of a prompt: its first layer (model order) with a cell whose input
// holds NaN or infinity (PromptAnalysis::nonFinite), which side holds it, its heads, tokens
// and parts, every such layer after it; none without one. Blocks are not named (findSuspects
// adds them). Ranked before every finite suspect: a NaN is off whatever its floor.
std::optional<Suspect> nonFiniteSuspect(const PromptAnalysis& prompt, const KvCacheConfig& config,
                                        const std::vector<char>* layersReady = nullptr);

// The bundle's suspects: the prompts' suspects of the same pattern and onset layer pooled
// (heads, ranks, layers, blocks united; the score the highest), best first.
std::vector<Suspect> poolSuspects(const std::vector<std::vector<Suspect>>& perPrompt);

}  // namespace kvscope
