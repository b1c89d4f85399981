#pragma once
// The tests of each suspect pattern against the onset layer's off cells (off_floor.h): each
// checks the pattern's defining property on its own and says what it names.
// suspect_search.h combines them with the tested explanations (hypotheses.h).

#include "analysis/off_floor.h"
#include "format/capture_bundle.h"
#include "format/kv_cache_config.h"

#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <vector>

namespace kvscope {

// The onset (the first affected layer) and its off cells, summarised: what every test reads.
struct Onset {
    const PromptAnalysis& prompt;
    const KvCacheConfig& config;
    const OffFloor& floor;
    const std::vector<char>* layersReady;  // null: every layer
    int layer = -1;
    int group = -1;                  // the layer's KV cache group
    std::vector<int> perHead;        // off cells per head
    int perPart[2] = {0, 0};         // off cells of K and V
    std::set<std::int64_t> tokens;   // where they are
    std::vector<int> heads;          // the heads with a fair share of the worst head's off cells
    bool oneHead = false;            // nine tenths in one head
    bool allHeads = false;
    std::string kv;                  // "k", "v" or "kv": a part with a tenth or less is left out
    const OffCell* worst = nullptr;

    Onset(const PromptAnalysis& p, const KvCacheConfig& config, const OffFloor& floor, const std::vector<char>* ready);
    const std::vector<OffCell>& cells() const { return floor.cells[std::size_t(layer)]; }
    bool ready(int layer) const;
    std::int64_t firstToken() const { return *tokens.begin(); }
    std::int64_t lastToken() const { return *tokens.rbegin(); }
};

// "prefill", "decode" or "both", for tokens first..last of a prompt of promptLen.
const char* phaseOf(std::int64_t first, std::int64_t last, std::int64_t promptLen);
// "k", "v" or "kv" for off cells in K and V: a part with a tenth of them or less is left out.
const char* partsOf(int kCells, int vCells);

// The onset's rows: the tokens where more than half the heads have an off cell.
std::set<std::int64_t> rowTokens(const Onset& onset);
// block: K and V of every head at the tokens of one or two blocks of the onset's group, in
// most of the group's layers from its first one on, and in no layer of another group (the
// rows' tokens: a stray noise cell of one head elsewhere does not widen the block).
bool looksLikeBlock(const Onset& onset);
// The share of the tokens the onset layer holds that have an off cell.
double tokenCoverage(const Onset& onset);
// position: a span of positions (prefill, decode or both), nearly every token in it off, with
// clean positions held outside it, in the heads that carry the error.
bool looksLikePositionSpan(const Onset& onset);
// Whether the onset layer holds decode positions only (a sliding window dropped the prompt):
// a span and the whole layer then look the same.
bool holdsOnlyDecode(const Onset& onset);
// window_edge: the onset at or after a sliding-window layer, nothing off before the sequence
// first fills that window (and a clean token held before it: the error is seen to start
// there), then the error from there to the end: that window, or 0.
int windowEdgeOf(const Onset& onset);
// A window that does not match the layer's type: in every layer of the onset's type (the
// sliding ones, or the full ones; two at least), the positions off in (more than half of) the
// heads are exactly those older than `kept` when they were read (their age: the sequence
// length of the snapshot that wrote them, minus the position), and no layer of the other type
// is affected: a window's edge in the wrong place (offered when zeros explain the data there).
struct WindowMismatch {
    bool sliding = false;            // the sliding layers (else the full ones)
    std::int64_t kept = 0;           // the positions kept: every off one is older, no clean one
    std::int64_t referenceKept = 0;  // the oldest age the reference holds in those layers
    int window = 0;                  // the model's sliding window (0: none declared)
    std::vector<int> layers;         // of that type, every one affected
    int otherLayers = 0;             // of the other type, none affected
    std::int64_t first = -1, last = -1;  // the onset layer's off positions
};
std::optional<WindowMismatch> windowMismatchOf(const Onset& onset, const std::vector<SnapshotInfo>& snapshots);

// tp_rank: the heads are exactly those of some ranks (not all of them): those ranks, or none.
std::vector<int> ranksOfHeads(const Onset& onset);
// The DCP ranks holding a fair share (a fifth of the most) of `tokens` of `group`; empty
// without decode context parallelism.
std::vector<int> dcpRanksOf(const KvCacheConfig& config, int group, const std::set<std::int64_t>& tokens);
// tp_rank under decode context parallelism: the off positions are those some DCP ranks hold
// (not all of them), at least half of those ranks' positions from the first off one to the
// last are off, and at least two of the other ranks' positions lie between: those DCP ranks, or none.
std::vector<int> dcpShareOf(const Onset& onset);

}  // namespace kvscope
