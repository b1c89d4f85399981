#pragma once
// Whose KV is this: when nothing at the onset layer's own place explains its off vectors
// (hypotheses.h), the capture itself is searched for them, in a sample, bounded in cost:
// - other_layer: the same positions in another layer of the same prompt, any head (layer
//   sharing, or a layer index off by one), the nearest kMaxWhoseLayers layers, nearest first;
// - other_prompt: the same layer of another prompt of the capture, at the same positions,
//   else at one offset found from a few cells' nearest vectors (a prefix-cache or LoRA key
//   collision).
// A source is offered only when it brings the off vectors back near the floor (the
// HypothesisInput's explained bound) at the cells it holds, at least kWhoseMinCells of them.

#include "analysis/hypotheses.h"
#include "format/capture_bundle.h"

#include <optional>

namespace kvscope {

class CaptureLoader;

constexpr int kWhoseMinCells = 8;  // cells a source must hold to be tested at all

struct WhoseKvInput {
    const CaptureLoader& loader;
    const HypothesisInput& onset;  // the onset layer's off cells, engine vectors and ratios
    ReferenceRole role;            // the reference the analysis measures against
};

// The first source that explains the off vectors (kind "other_layer" or "other_prompt"), or
// none. Reads two positions of each candidate layer (eight of one that fits there), and of
// each other prompt (kMaxWhosePrompts of them) a few positions, then its onset layer once.
constexpr int kMaxWhoseLayers = 8;
constexpr int kMaxWhosePrompts = 16;
std::optional<Hypothesis> whoseKv(const WhoseKvInput& in);

}  // namespace kvscope
