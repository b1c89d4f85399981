#pragma once
// Explanations tested against the data. For the onset layer's off cells (off_floor.h), each
// hypothesis is a transformation of the reference that predicts the engine's vectors; its
// residual is how far the engine stays from that prediction, in the same floors as the error
// (CellRatios::between), the median over the cells. A hypothesis explains the error when its
// residual is back near the floor (SuspectThresholds::explained). Generic, not one per known
// bug:
// - data from elsewhere: token t holds reference token t + d; head i holds reference head j
//   (a rank holding another rank's shard is such a mapping); K holds V and V holds K;
// - a layout: each TP rank's block read in another order than written (kv/block_layout.h:
//   token-major against head-major, K and V split against interleaved), the reference laid
//   out as the engine wrote it and re-read the other way;
// - a scale: the least-squares factor per head and part, reported per layer, rank or head;
// - zeros: never written;
// - RoPE (with the bundle's rope settings): K rotated for another position (a constant
//   offset, or positions restarted at the first off token), in the other pair convention,
//   with another base or position scaling, or over other rotary dims;
// - unrelated: the nearest vector of any token, head and part of the reference layer, which
//   stays far when the data is stale or another sequence's;
// - magnitude with the direction intact, free fits tried only when nothing above explains and
//   offered only when they explain outright: a factor per token, a factor per channel, a
//   constant bias per head (before RoPE), values clipped at a bound.

#include "analysis/off_floor.h"
#include "analysis/suspect.h"
#include "format/capture_bundle.h"
#include "format/kv_cache_config.h"
#include "format/rope_settings.h"
#include "kv/sampled_layer.h"

#include <optional>
#include <vector>

namespace kvscope {

struct HypothesisInput {
    const PromptAnalysis& prompt;
    const KvCacheConfig& config;
    const CellRatios& ratios;
    int layer = 0;
    const std::vector<OffCell>& cells;  // the off cells to explain
    // At least the positions hypothesisPositions() names (SampledLayer::of: all of them).
    const SampledLayer& engine;
    const SampledLayer& reference;      // the side the analysis measures against (three-way: the baseline)
    std::optional<RopeSettings> rope;
    double explained = 2.0;             // a residual at most this explains the error (floors)
    // The prompt's snapshots (when known): a layout misread reads rows of the block that the
    // snapshot that wrote a position had not written yet, whose values nothing predicts.
    const std::vector<SnapshotInfo>* snapshots = nullptr;
};

// Every hypothesis tried, best first: lowest residual, the simpler one on a near tie.
std::vector<Hypothesis> testHypotheses(const HypothesisInput& input);

// A lead must lead: a hypothesis is offered (explaining or nearest) only when it removes at
// least this share of the error above the layer's clean level: its residual at most
// clean + (1 - kLeadShare) (error - clean). A nearest one that leaves most of the error, or
// makes it worse, sends the user the wrong way.
constexpr double kLeadShare = 0.5;
bool clearlyLowers(const Hypothesis& h, double cleanLevel);

// The positions the hypotheses read of a layer of `seq` positions and `heads` heads: of the
// engine, the sampled off cells' tokens; of the reference, those and the tokens near them
// (shifted data) and an even sample of the layer (the nearest vector of any position).
struct HypothesisPositions {
    std::vector<std::int64_t> engine, reference;
};
HypothesisPositions hypothesisPositions(const PromptAnalysis& prompt, const KvCacheConfig& config, int layer,
                                        const std::vector<OffCell>& cells, std::int64_t seq, int heads);

}  // namespace kvscope
