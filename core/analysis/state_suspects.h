#pragma once
// The suspects of a prompt's state-space layers (docs/suspects.md, "Recurrent state"): the
// first layer in the model's order whose state is off its floor, the checkpoints and units
// that are, and a hypothesis tested against the engine's state down to the floor:
// - state_stale: the state of an earlier position (the reference's checkpoints before it);
// - state_other_request: another prompt's state (any of its checkpoints);
// - state_not_reset: the reference state plus a leftover, another prompt's final state times a
//   factor per unit (a slot reused without clearing; the recurrence decays it per head);
// - zeros; scale: one factor over the part.
// None explains it: "unexplained", with what was measured (direction against size, the parts
// and units off). A state layer that drifts below a KV suspect's onset (after it in the model,
// from its first token on) joins that suspect's spread unless a state hypothesis explains it:
// an attention fault upstream still ranks first, as a state fault upstream of KV ones does.
#include "analysis/analysis_result.h"
#include "analysis/state_analysis.h"
#include "analysis/suspect.h"
#include <string>
#include <vector>

namespace kvscope {

class CaptureLoader;

// Tests hypotheses for the off states of `p` (its `states`, analysed) and merges the suspects
// into p.suspects in their order. `otherPrompts`: the prompts whose expected states the
// other-request hypotheses may come from. `modelOrder`: every layer of the model, in order.
void addStateSuspects(const CaptureLoader& loader, PromptAnalysis& p, const std::vector<std::string>& otherPrompts,
                      const std::vector<std::string>& modelOrder, const SuspectThresholds& thresholds);

}  // namespace kvscope
