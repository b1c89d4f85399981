#pragma once
// What a suspect says, as plain values: the pattern from a closed set, the evidence in one
// sentence, the onset and the spread, and the attribution (heads, TP ranks, tokens, blocks).
// Found by analysis/suspect_search.h; documented in docs/suspects.md.

#include "analysis/provenance_match.h"
#include "format/impact_record.h"
#include "format/paged_kv.h"

#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace kvscope {

// NonFinite: a NaN or infinity in an input (the engine's cache or a reference side), named
// before every finite suspect: a cell holding one is off whatever its floor.
// State: a state-space layer's recurrent state (analysis/state_suspects.h).
enum class SuspectPattern { Block, TpRank, Head, Position, WindowEdge, Layer, Unexplained, NonFinite, State };
const char* suspectPatternName(SuspectPattern pattern);  // "block", "tp_rank", ..., "unexplained", "non_finite", "state"

// When a cell is off the noise floor (analysis/off_floor.h): its ratio in floors above
// floor + perDecade * log10(cells tested / 1000) (never below floor), so that the chance that
// noise alone crosses it stays the same however many cells a capture has.
struct SuspectThresholds {
    double offFloor = 6.0;          // in floors: what rounding alone stays below
    double perDecade = 2.6;         // the clean tail: about 2.6 floors per tenfold cells (docs/suspects.md)
    // Two-way, added: what two bf16 runs drift apart through the layers, in bf16 unit
    // roundoffs at layer 0, times sqrt(layer + 1) deeper (independent rounding differences add
    // up like a random walk); converted to the cache dtype's floors (an fp8 cache's floor is 16
    // times bf16's).
    double twoWayDrift = 20.0;
    double twoWayDriftPerDecade = 4.0;
    int minCells = 3;               // an affected layer has at least this many off cells,
    double falseLayerChance = 0.01; // and more than noise puts in one layer with this chance (split over the layers)
    double explained = 2.0;         // a hypothesis explains the error when its residual is at most this
                                    // times the layer's clean level (at least 1 floor)
    bool operator==(const SuspectThresholds&) const = default;
};

// A transformation of the reference that reproduces the engine's KV at the onset's off
// cells (analysis/hypotheses.h): what it is, its parameters, and how far from the engine it
// leaves them, in the same floors as the error.
struct Hypothesis {
    std::string kind;  // "scale", "token_shift", "head_swap", "kv_swap", "layout", "zeros", "unrelated", "rope_offset", ...
    std::vector<std::pair<std::string, double>> parameters;  // e.g. {"factor", 1.25}, {"offset", 1}
    std::string text;               // "actual head 0 holds reference head 1"
    double residualFloors = 0;      // median over the off cells of their error after it
    double errorFloors = 0;         // the same cells' median error before it
    double explainedShare = 0;      // the share of the off cells it brings back near the floor
    // Parameters that are names (a layout's "written_as" / "read_as"); empty for most kinds.
    std::vector<std::pair<std::string, std::string>> labels{};

    // A parameter's value (NaN when it has none of that name).
    double parameter(const std::string& name) const
    {
        for (const auto& [n, v] : parameters)
            if (n == name)
                return v;
        return std::nan("");
    }
    // A label's value (empty when it has none of that name).
    std::string label(const std::string& name) const
    {
        for (const auto& [n, v] : labels)
            if (n == name)
                return v;
        return {};
    }
};

// What an unexplained suspect's error looks like at the onset's off cells, from principles
// that hold for any fault (analysis/error_shape.h, docs/suspects.md "Measured"): the direction
// against the size, the axes it varies along, and the parts that are off.
struct ErrorShape {
    bool directionKept = false;
    double directionFloors = 0;  // median error left after each cell's own best factor, in floors
    double oneMinusCos = 0;      // median 1 - cos(engine, reference)
    bool sizeOff = false;
    double sizeFloors = 0;       // median size error (each cell's best factor - 1), in floors
    double sizeMin = 1, sizeMax = 1;  // the engine's L2 norm over the reference's, over the cells
    // The axes carrying the variation beyond noise: "token", "block_position", "head", "part",
    // "channel"; {"cell"}: it varies along none of them alone; empty: the same everywhere.
    std::vector<std::string> variesAlong;
    std::vector<std::pair<std::string, double>> shares;  // each axis's share of that variation
    std::vector<std::string> parts;  // "k", "v": the parts with at least a tenth of the off cells
    int cells = 0;                   // cells measured
    std::string text;                // "direction kept (...); size off by 0.4-1.6x, varying by token; K only"
};

// Where the error lies against the engine's structure (analysis/structural_evidence.h): a
// placement with its statistic, not a transformation of the values.
struct StructuralFinding {
    std::string kind;  // "last_block_fill", "chunk_boundary"
    std::vector<std::pair<std::string, double>> parameters;  // e.g. {"block_size", 16}, {"chunk", 2}
    std::string text;  // "off in the first 3 decode positions of the 3 prompts whose last block ..."

    double parameter(const std::string& name) const
    {
        for (const auto& [n, v] : parameters)
            if (n == name)
                return v;
        return std::nan("");
    }
};

// Whether the suspect matters (analysis/impact_summary.h): the reference model reading the
// engine's KV from the onset layer on, against reading the baseline's there (what bf16 noise
// does), and the onset layer's alone.
struct SuspectImpact {
    std::string layer;  // the onset: its KV and every later attention layer's replaced
    ImpactFigures engine;
    std::optional<ImpactFigures> noise;  // the baseline's KV in the same layers (three-way)
    std::optional<ImpactFigures> alone;  // the engine's KV in the onset layer only
    std::vector<std::string> prompts;    // whose decode steps these are
    std::string text;  // "With the engine's KV from L on, the reference's next token changes at 8 of 120 ..."
};

struct SuspectBlock {
    int group = 0;
    std::int64_t logical = 0;
    std::int64_t physical = -1;  // from the block table of the snapshot that wrote the position
};

struct Suspect {
    SuspectPattern pattern = SuspectPattern::Layer;
    double score = 0;      // the onset layer's median ratio over its off cells, in floors (non_finite: +inf)
    // The hypothesis that explains it (residual within SuspectThresholds::explained), or for
    // an unexplained suspect the nearest one tried if it clearly lowers the error
    // (clearlyLowers, analysis/hypotheses.h); kind empty when none does or none could be tried.
    Hypothesis hypothesis;
    std::vector<Hypothesis> tried;  // every hypothesis tested, best first
    std::optional<ErrorShape> measured;  // unexplained (and window_edge) suspects only
    // The bundle records where each position's KV came from, and every off position of the
    // onset came the same way (analysis/provenance_match.h); empty otherwise.
    std::optional<ProvenanceMatch> provenance;
    // The structure the off positions follow (a chunk boundary; the last block's fill across
    // prompts), when one accounts for every one of them; said at the end of the evidence.
    std::optional<StructuralFinding> structure;
    // What it does to the output, where the bundle measured it (prompts/<id>/impact); said apart
    // from the evidence.
    std::optional<SuspectImpact> impact;
    std::string evidence;  // one sentence, about one prompt:
    std::string evidencePrompt;        // that prompt
    std::vector<std::string> prompts;  // where it was seen (one per prompt; pooled: every one)
    std::string firstLayer;
    std::vector<std::string> layers;  // every affected layer, the onset first
    std::string kv;                   // "k", "v" or "kv"
    // Prefix caching: the physical block holding the onset token when other prompts share it,
    // and every prompt that does (kv/block_sharing.h); -1 and empty otherwise.
    std::int64_t sharedBlock = -1;
    std::vector<std::string> sharedBy;
    std::vector<int> heads;
    std::vector<int> tpRanks;
    // Decode context parallelism: the DCP ranks holding the off positions (tpRanks is then
    // narrowed to the ranks of those DCP ranks); empty without DCP.
    std::vector<int> dcpRanks;
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
