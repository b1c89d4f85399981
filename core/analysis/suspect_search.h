#pragma once
// Suspects: where the engine's KV first leaves the noise floor of the capture itself, what
// kind of bug that looks like, and the evidence (docs/suspects.md).
//
// A cell (layer, token, head, K/V) is off the floor when its error ratio (analysis_result.h:
// its L-inf over the cell's dtype noise floor; two-way: over the capture's median L-inf) is
// above `offFloor` times the capture's own typical ratio (at least 1), so that a cache that
// is noisier everywhere (fp8) is judged against itself. A layer is affected when enough of
// its cells are off. The onset is the first affected layer in model order and its earliest
// off cell; later affected layers are the spread, never a suspect of their own: a
// downstream effect is never ranked above its cause. The onset layer's off cells decide the
// pattern, from a closed set.

#include "analysis/analysis_result.h"
#include "analysis/suspect.h"

#include <cstdint>
#include <string>
#include <vector>

namespace kvscope {

class CaptureLoader;
class WorkTeam;

// The suspects of one analysed prompt, best first (at most one: its onset). `layersReady`
// (optional) limits the search to finished layers. With a `team`, its threads share the
// layers.
std::vector<Suspect> findSuspects(const CaptureLoader& loader, const PromptAnalysis& prompt,
                                  const SuspectThresholds& thresholds = {},
                                  const std::vector<char>* layersReady = nullptr, WorkTeam* team = nullptr);

// The bundle's suspects: the prompts' suspects of the same pattern and onset layer pooled
// (heads, ranks, layers, blocks united; the score the highest), best first.
std::vector<Suspect> poolSuspects(const std::vector<std::vector<Suspect>>& perPrompt);

}  // namespace kvscope
