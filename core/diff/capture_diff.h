#pragma once
// kvscope diff: did B (a capture after an engine change) get worse than A (before it, or
// another engine against the same reference)? Both are measured in the same floors (the
// cell's error ratio, analysis/off_floor.h), so a move is judged against what rounding does:
//
// - a cell is worse when B's ratio is off the floor (above the threshold rounding stays below,
//   the suspects' own) and more than `maxWorse` times A's; better the other way round;
// - a layer is worse when its statistic (max, p99 or median over its cells, K and V apart, the
//   matched prompts pooled) is above what run-to-run noise reaches and more than `maxWorse`
//   times A's: noise reaches the off-floor threshold for the max and p99, and 2 floors for
//   the median (three-way; two-way the drift-allowing threshold for all three);
// - the suspects of the change are B's suspects found among the cells that got worse only.
//
// Prompts are matched by their token ids; matched prompts must have been compared against the
// same reference (fingerprints of expected, and of baseline for three-way), in the same mode.

#include "analysis/analysis_result.h"
#include "analysis/suspect.h"
#include "diff/diff_side.h"

#include <array>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace kvscope {

class CaptureLoader;

enum class DiffStat { Max, P99, Median };
const char* diffStatName(DiffStat stat);  // "max", "p99", "median"
bool parseDiffStat(const std::string& name, DiffStat& stat);

struct DiffOptions {
    double maxWorse = 1.5;
    DiffStat stat = DiffStat::Max;
    SuspectThresholds suspects;
};

// Captures that cannot be compared: no prompt in common, another reference, another mode.
class DiffMismatch : public std::runtime_error {
public:
    using std::runtime_error::runtime_error;
};

enum class Change { Same, Worse, Better };
const char* changeName(Change change);  // "same", "worse", "better"

struct CellMove {
    std::string prompt;  // B's id
    int layer = -1;      // B's layer index
    std::int64_t token = -1;
    KvPart part = KvPart::K;
    float a = 0, b = 0;  // the cell's ratio in A and in B, in floors
};

struct LayerDiff {
    std::string name;
    int layer = -1;                       // B's index
    std::array<float, 2> statA{}, statB{};  // [K/V], floors (NaN: no cell)
    std::array<double, 2> noise{};        // what the statistic must pass to count, floors
    std::array<std::int64_t, 2> cells{}, worseCells{}, betterCells{};
    std::array<Change, 2> change{Change::Same, Change::Same};
    std::optional<CellMove> firstWorse;   // the earliest token of a worse cell (either part)

    Change verdict() const;  // worse if either part is, else better if either is
};

// One matched prompt's cells on both sides, over B's layers: what the maps show.
struct DiffPromptMaps {
    std::string a, b;  // the prompts' ids
    std::int64_t tokens = 0;
    CellRatioMaxima ratiosA, ratiosB;  // [K/V][layer * tokens + token], floors
};

struct DiffResult {
    std::string pathA, pathB;
    bool aFromAnalysisJson = false;
    DiffOptions options;
    std::vector<std::pair<std::string, std::string>> matched;  // (A's id, B's id)
    std::vector<std::string> onlyA, onlyB;                     // prompts without a match
    std::vector<std::string> layersOnlyA, layersOnlyB;
    bool threeWay = false;
    bool referenceFromA = false;  // B is an engine-only capture, compared against A's reference
    std::vector<std::string> layerNamesB;  // B's analysed layers (CellMove::layer indexes them)
    std::array<std::string, 2> partNames{"k", "v"};  // an MLA latent's "c_kv", "k_pe"
    std::vector<LayerDiff> layers;   // the layers both have, in B's model order
    std::vector<CellMove> worstMoves;  // the worse cells, highest in B first (at most 20)
    std::optional<CellMove> firstWorse;  // in the first worse layer
    std::vector<Suspect> suspects;   // of the change, pooled, best first
    std::vector<DiffPromptMaps> maps;  // per matched pair, in B's order

    int count(Change change) const;
    Change verdict() const { return count(Change::Worse) ? Change::Worse : count(Change::Better) ? Change::Better : Change::Same; }
};

// `b` analysed from `loaderB` (suspects need its KV); `a` from diffSideOf or readDiffSide.
// Throws DiffMismatch when the two cannot be compared.
DiffResult diffAnalyses(const DiffSide& a, const AnalysisResult& b, const CaptureLoader& loaderB, const DiffOptions& options);

}  // namespace kvscope
