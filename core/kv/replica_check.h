#pragma once
// Replicas that disagree. Where TP replicates KV (an MLA latent on every rank; KV heads fewer
// than ranks), the analysis reads one copy of each head; every other rank holding it must hold
// the same bytes in the blocks the sequence uses. A copy that differs is a finding of its own:
// a rank whose cache write went wrong, which the one copy read cannot show.

#include "kv/position_range.h"

#include <cstdint>
#include <string>
#include <vector>

namespace kvscope {

class CaptureLoader;

struct ReplicaDifference {
    std::string layer;
    std::size_t snapshot = 0;
    int rank = 0;           // the copy that differs
    int againstRank = 0;    // the copy the analysis reads
    std::string part;       // "k", "v", or an MLA latent's "c_kv", "k_pe" (the first that differs)
    std::int64_t physicalBlock = -1;  // the first differing block, in logical order
    std::int64_t logicalBlock = -1;
    std::int64_t firstPosition = 0;   // the first and last position that block holds on this rank
    std::int64_t lastPosition = 0;    // (with DCP, this rank's share of the positions between them)
    int blocks = 0;         // differing blocks of this rank in this snapshot
    // Replicated KV heads (fewer heads than ranks): the head both copies should hold, and a
    // copy that is another head's instead, bit for bit in every block compared (that head's
    // copy on `holdsFrom`): the replica (`rank`) or the copy read (`againstRank`). -1: none.
    int head = -1;
    int copyHoldsHead = -1;  // `rank` holds this head instead of `head`
    int readHoldsHead = -1;  // `againstRank` holds this head instead, its replica `rank` is right
    int holdsFrom = -1;      // the rank whose copy of that head it equals

    // "TP rank 1's copy of c_kv of model.layers.2.self_attn differs from rank 0's from physical block 7 (logical 3,
    // positions 24-31; 2 block(s) differ, snapshot 0)", and what a copy holding another head holds:
    // "; rank 3 holds KV head 0, should hold head 1 (its replica on rank 2 does): its copy is rank 0's
    // bit for bit"
    std::string describe() const;
    // "TP rank 3 holds KV head 0, should hold head 1 (its replica on rank 2 does)", or empty.
    std::string wrongHeadText() const;
};

// Every rank's copy of `layer` of `promptId` compared with the copy the analysis reads, block by
// block over the blocks each snapshot's sequence uses (bytes and scales alike). Nothing when TP
// does not replicate. Where a copy differs and heads are replicated, each side is also compared
// with the other heads' copies: one that equals another head's is named as holding it. Throws BundleError when a replica cannot be read or has another shape.
// With a `window`, only the blocks whose first held position lies in it (each block in one
// window); mergeReplicaDifferences() adds up the windows' findings, in window order.
std::vector<ReplicaDifference> findReplicaDifferences(const CaptureLoader& loader, const std::string& promptId,
                                                      const std::string& layer,
                                                      PositionRange window = PositionRange::all());
// A later window's differences into `found`: a copy already found keeps its first block and
// counts the later ones; a head it holds stays named only when every window says the same.
void mergeReplicaDifferences(std::vector<ReplicaDifference>& found, const std::vector<ReplicaDifference>& later);

}  // namespace kvscope
