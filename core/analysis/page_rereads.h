#pragma once
// Explanations tested on the engine's own stored pages read from another place, where what the
// analysis merged is right data in the wrong place: each predicts that the page re-read from
// where it says the data went gives back the reference at the off cells (in the same floors as
// the error). And the suspect a replica holding another head makes, which no off cell shows.
// - the cache's page order: a layer's cache written K/V-first ([2, num_blocks, ...]) and read
//   blocks-first ([num_blocks, 2, ...]), or the other way round (kv/block_layout.h's
//   cacheMisreads): each page read holds another block's, so the error spans blocks and parts
//   and nothing at the page's own place predicts it;
// - GQA replicas (fewer KV heads than TP ranks) holding the wrong head (kv/replica_check.h):
//   a rank the analysis reads holding another head while its replica holds the right one
//   (the merged cache then looks like a head map or a shard swap; the replica says which rank
//   is wrong), or a replica holding another head while the copy read is right.

#include "analysis/analysis_result.h"
#include "analysis/hypotheses.h"
#include "analysis/suspect.h"

#include <optional>
#include <vector>

namespace kvscope {

class CaptureLoader;

// The cache's page orders exchanged: each misread's inverse applied to the stored pages (the
// same head and row of the page the written order put there). Offered when it explains (at
// most `in.explained` floors) for the misread it names, kind "layout" with labels written_as
// and read_as ("kv_first" / "blocks_first"). None under DCP (a block's rows are not
// consecutive positions) or for a layer of one part.
std::optional<Hypothesis> cacheOrderHypothesis(const CaptureLoader& loader, const HypothesisInput& in);

// A rank the analysis reads holding another head, its replica the right one: among
// `differences` (the prompt's replica differences), one of this layer whose read copy equals
// another head's bit for bit; the off cells of the head it should hold re-read from the
// replica. Kind "replica_head" (parameters rank, holds_head, should_hold_head, replica_rank,
// equals_rank, read 1), when it explains.
std::optional<Hypothesis> readRankHeadHypothesis(const CaptureLoader& loader, const HypothesisInput& in,
                                                 const std::vector<ReplicaDifference>& differences);

// A replica holding another head while the copy read is right: one suspect per such replica
// difference of `p` (pattern tp_rank, the replica's rank, the head it should hold, hypothesis
// "replica_head" with read 0, residual 0: bit for bit another head's copy). Score 0: it ranks
// after every suspect an off cell makes.
std::vector<Suspect> replicaHeadSuspects(const PromptAnalysis& p);

}  // namespace kvscope
