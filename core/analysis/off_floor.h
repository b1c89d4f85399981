#pragma once
// Which cells of a prompt are off the noise floor, and which layers that affects: the first
// step of the suspects (suspect_search.h), on which every pattern test then works.
//
// The floor is absolute, never the capture's own typical error (a fault in every cell would
// be its own typical):
// - three-way: a cell's error ratio (analysis_result.h): its L-inf over what bf16 alone does
//   there (the expected-vs-baseline error), and at least what storing expected the way a
//   quantised cache stores it costs;
// - two-way: a cell's relative L2 over the cache dtype's unit roundoff (bf16 2^-8), or for a
//   quantised cache over what storing expected that way costs (its format, its own scales):
//   the engine and the reference differ there by at least the dtype's rounding. L2, not
//   L-inf: the drift of two bf16 runs through the layers piles up in single elements (L-inf
//   tails 2x longer) while a fault moves whole vectors. Without a baseline the drift itself is
//   not measured: the threshold allows for it, growing with depth (SuspectThresholds), so
//   two-way misses faults smaller than that drift.
// A cell is off above a threshold that grows with the number of cells tested
// (SuspectThresholds), and a layer is affected when at least minCells of its cells are off, at
// two tokens or more, or at a token that is off in another layer too (a real onset persists).

#include "analysis/analysis_result.h"
#include "analysis/suspect.h"
#include "util/median.h"

#include <array>
#include <cmath>
#include <cstdint>
#include <functional>
#include <vector>

namespace kvscope {

class WorkTeam;

struct OffCell {
    std::int64_t token;
    int head;
    KvPart part;
    float ratio;  // in floors
};

// How far each cell is off, in floors. The floors are kept (per token, or per layer), not the
// ratios: a cell's ratio is one division.
class CellRatios {
public:
    CellRatios(const PromptAnalysis& p, WorkTeam* team);
    // NaN where the cell has no data.
    float at(int layer, std::int64_t token, int head, KvPart part) const;
    // The same measure for any two vectors of the cell (an engine vector against a prediction
    // of it): `reference` is the side the analysis measures against (three-way the baseline).
    double between(int layer, std::int64_t token, KvPart part, const float* reference, const float* predicted,
                   const float* actual, int dim) const;


private:
    double floorOf(int layer, std::int64_t token, KvPart part) const;

    const PromptAnalysis& m_p;
    std::vector<double> m_floors[2];   // [K/V][layer][token]
};

// A cell's floor: three-way the expected-vs-baseline error there (at least a quantised cache's
// storage cost); two-way the cache dtype's unit roundoff, or what storing the reference in a
// quantised cache's format costs. NaN: no data.
double cellFloor(const PromptAnalysis& p, KvPart part, int layer, std::int64_t token);
// The finite cells of each finished layer (both parts), as the thresholds count them.
std::vector<std::int64_t> finiteCells(const PromptAnalysis& p, const std::vector<char>* layersReady, WorkTeam* team = nullptr);
// [layer]: a cell whose ratio is above it is off, `tested` cells having been tested (two-way:
// the drift in each finished layer's typical floor, the median of its cells').
std::vector<double> layerOffThresholds(const PromptAnalysis& p, const SuspectThresholds& th, std::int64_t tested,
                                       const std::vector<char>* layersReady);
// The map's "off" (map_spec.h's ScaleKind::Ratio), per layer: the same rule for a hundred times
// the cells, so that noise reaches it once in a hundred captures. The suspects' own threshold
// lets about one noise cell a capture through (their layer rules then discard it); a map must not
// paint that cell loud on a clean capture. Reads only the finished layers.
inline constexpr double kMapNoiseCaptures = 100;
std::vector<double> mapOffThresholds(const PromptAnalysis& p, const SuspectThresholds& th, const std::vector<char>* layersReady);
// In the layers a suspect of `p` affects, the suspects' own threshold instead: their layer
// rules have already told a fault from noise there, and a cell they call off must not be drawn
// as "not off" (two-way, the drift allowance's tail puts the two thresholds far apart). Reads
// p.suspects: only once the analysis is over.
void useSuspectThresholds(const PromptAnalysis& p, const SuspectThresholds& th, const std::vector<char>* layersReady,
                          std::vector<double>& thresholds);

// What the map paints off once the analysis is over: mapOffThresholds, the suspects' own in
// their layers (useSuspectThresholds). Every view that says "off" after the fact uses it.
std::vector<double> finalMapOffThresholds(const PromptAnalysis& p, const SuspectThresholds& th);

struct OffFloor {
    CellRatios ratios;
    std::int64_t tested = 0;      // finite cells of the finished layers
    std::vector<double> threshold;  // [layer]: a cell whose ratio is above it is off
    std::vector<std::vector<OffCell>> cells;   // [layer]: its off cells
    std::vector<int> affected;                 // the affected layers, in model order
};

// Every (layer, token) cell's ratio, the largest over its heads: [K/V][layer * tokens + token]
// (NaN: no data). What kvscope diff compares between two runs, and the analysis JSON's
// `error_ratios`.
using CellRatioMaxima = std::array<std::vector<float>, 2>;
CellRatioMaxima cellRatioMaxima(const PromptAnalysis& p, WorkTeam* team = nullptr);

// kvscope diff: an earlier run of the same prompt (its cellRatioMaxima over this prompt's
// layers and tokens). A cell then counts as off only where it is also more than `factor`
// times the earlier run's ratio of that cell; a cell the earlier run has no data for is not.
struct EarlierRun {
    const CellRatioMaxima* ratios = nullptr;
    double factor = 1.5;
    bool allows(const PromptAnalysis& p, int layer, std::int64_t token, KvPart part, float ratio) const
    {
        const float before = (*ratios)[std::size_t(part)][std::size_t(layer) * std::size_t(p.tokens) + std::size_t(token)];
        return std::isfinite(before) && double(ratio) > factor * double(before);
    }
};

// The threshold for `cells` tested: floor + perDecade * log10(cells / 1000), at least floor.
double offThreshold(double floor, double perDecade, std::int64_t cells);
// The fewest off cells a layer of `layerCells` cells needs at `threshold` so that noise alone
// reaches as many with a chance under `chance`: the clean tail lets through layerCells / 1000
// x 10^(-(threshold - offFloor) / perDecade) cells on average (docs/suspects.md), a Poisson count.
int noiseOffCells(std::int64_t layerCells, double threshold, const SuspectThresholds& th, double chance);

// The typical ratio of a layer's cells that are not off (at least a tenth of them), else of the
// nearest earlier layer's, else 1: the level an explained error comes back to.
double cleanLevel(const OffFloor& floor, const PromptAnalysis& p, int layer);

// `layersReady` (optional) limits it to finished layers; with a `team`, its threads share
// the layers.
// `earlier` (optional): only cells worse than in that run count (EarlierRun).
OffFloor findOffFloor(const PromptAnalysis& p, const SuspectThresholds& thresholds,
                      const std::vector<char>* layersReady = nullptr, WorkTeam* team = nullptr,
                      const EarlierRun* earlier = nullptr);

// Whether `layer` is finished (`layersReady` null: every layer is).
inline bool layerIsReady(const std::vector<char>* layersReady, int layer)
{
    return !layersReady || (std::size_t(layer) < layersReady->size() && (*layersReady)[std::size_t(layer)]);
}

// fn(layer) for every layer of `p`, over the team's threads when there is one; each layer's
// cells released after (PromptAnalysis::releaseLayer), so that a pass over spilled results
// keeps only the layers in hand.
void forEachLayer(WorkTeam* team, const PromptAnalysis& p, const std::function<void(int)>& fn);

}  // namespace kvscope
