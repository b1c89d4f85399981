#pragma once
// Which cells of a prompt are off the noise floor, and which layers that affects: the first
// step of the suspects (suspect_search.h), on which every pattern test then works.
//
// A cell (layer, token, head, K/V) is off the floor when its error ratio (analysis_result.h:
// its L-inf over the cell's dtype noise floor) is above `offFloor` times its layer's typical
// (median) ratio, at least 1 and at most what the capture's typical layer has unless the
// layer jumps far above it, so that a cache that is noisier everywhere (fp8) is judged against
// itself. Two-way: its L-inf over its layer's median L-inf, above `twoWayFloor`. A layer is
// affected when enough of its cells are off.

#include "analysis/analysis_result.h"
#include "analysis/suspect.h"

#include <cstdint>
#include <functional>
#include <vector>

namespace kvscope {

class WorkTeam;

struct OffCell {
    std::int64_t token;
    int head;
    KvPart part;
    float ratio;
};

// How far each cell is off: its error ratio against the cell's noise floor (three-way). Two-way
// has no dtype-only reference: a cell's L-inf against its layer's median L-inf (faults
// confined to some tokens or heads), and a layer whose median is itself far above the
// capture's typical layer median is judged against that (a whole-layer fault). The floors
// are kept (per token, or per layer), not the ratios: a cell's ratio is one division.
class CellRatios {
public:
    CellRatios(const PromptAnalysis& p, double layerJump, WorkTeam* team);
    // NaN where the cell has no data.
    float at(int layer, std::int64_t token, int head, KvPart part) const;

private:
    const PromptAnalysis& m_p;
    std::vector<double> m_floors[2];  // [K/V][layer][token] (three-way) or [K/V][layer]
};

struct OffFloor {
    CellRatios ratios;
    std::vector<double> threshold[2];          // [K/V][layer]: a cell whose ratio is above it is off
    std::vector<std::vector<OffCell>> cells;   // [layer]: its off cells
    std::vector<int> affected;                 // the affected layers, in model order
};

// `layersReady` (optional) limits it to finished layers; with a `team`, its threads share
// the layers.
OffFloor findOffFloor(const PromptAnalysis& p, const SuspectThresholds& thresholds,
                      const std::vector<char>* layersReady = nullptr, WorkTeam* team = nullptr);

// Whether `layer` is finished (`layersReady` null: every layer is).
inline bool layerIsReady(const std::vector<char>* layersReady, int layer)
{
    return !layersReady || (std::size_t(layer) < layersReady->size() && (*layersReady)[std::size_t(layer)]);
}

// fn(layer) for every layer, over the team's threads when there is one.
void forEachLayer(WorkTeam* team, int layers, const std::function<void(int)>& fn);
// The median (NaN of none).
double median(std::vector<double> values);

}  // namespace kvscope
