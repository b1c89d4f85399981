#pragma once
// What a suspect says, as plain values: the pattern from a closed set, the evidence in one
// sentence, the onset and the spread, and the attribution (heads, TP ranks, tokens, blocks).
// Found by analysis/suspect_search.h; documented in docs/suspects.md.

#include "format/paged_kv.h"

#include <cstdint>
#include <string>
#include <vector>

namespace kvscope {

enum class SuspectPattern { Block, TpRank, Head, Position, WindowEdge, Layer };
const char* suspectPatternName(SuspectPattern pattern);  // "block", "tp_rank", ...

struct SuspectThresholds {
    double offFloor = 6.0;       // error ratio over the capture's typical ratio (at least 1)
    double twoWayFloor = 8.0;    // two-way: L-inf over its layer's median L-inf (and a layer's median over the typical)
    int minCells = 3;            // an affected layer has at least this many off cells
    double minFraction = 0.002;  // and this fraction of its cells
    double layerJump = 8.0;      // a layer whose typical ratio (two-way: median L-inf) is this far
                                 // above the capture's is off as a whole
};

struct SuspectBlock {
    int group = 0;
    std::int64_t logical = 0;
    std::int64_t physical = -1;  // from the block table of the snapshot that wrote the position
};

struct Suspect {
    SuspectPattern pattern = SuspectPattern::Layer;
    double score = 0;      // the onset layer's median ratio over its off cells, in floors
    std::string evidence;  // one sentence, about one prompt:
    std::string evidencePrompt;        // that prompt
    std::vector<std::string> prompts;  // where it was seen (one per prompt; pooled: every one)
    std::string firstLayer;
    std::vector<std::string> layers;  // every affected layer, the onset first
    std::string kv;                   // "k", "v" or "kv"
    std::vector<int> heads;
    std::vector<int> tpRanks;
    std::int64_t firstToken = -1, lastToken = -1;  // of the onset layer's off cells (pooled: over its prompts)
    std::string phase;                             // "prefill", "decode" or "both"
    std::vector<SuspectBlock> blocks;
    // Where the app opens it: the onset layer's worst cell.
    int worstLayer = -1;
    std::int64_t worstToken = -1;
    int worstHead = -1;
    KvPart worstPart = KvPart::K;
};

}  // namespace kvscope
