#include "analysis/state_analysis.h"

#include "analysis/off_floor.h"
#include "format/bundle_error.h"
#include "kv/capture_loader.h"
#include "metrics/vector_metrics.h"
#include "util/median.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>

namespace kvscope {

namespace {

// The index after "layers." in a layer's name ("model.layers.12.mixer" -> 12), or -1.
long indexInName(const std::string& name)
{
    const std::size_t at = name.rfind("layers.");
    if (at == std::string::npos)
        return -1;
    const char* digits = name.c_str() + at + 7;
    char* end = nullptr;
    const long n = std::strtol(digits, &end, 10);
    return end == digits ? -1 : n;
}

bool finite(const float* v, std::int64_t n)
{
    for (std::int64_t i = 0; i < n; ++i)
        if (!std::isfinite(v[i]))
            return false;
    return true;
}

double l2Norm(const float* v, std::int64_t n)
{
    double s = 0;
    for (std::int64_t i = 0; i < n; ++i)
        s += double(v[i]) * double(v[i]);
    return std::sqrt(s);
}

}  // namespace

std::vector<std::string> modelLayerOrder(const KvCacheConfig& config)
{
    std::vector<std::pair<long, std::string>> numbered;
    long configOrder = 0;
    bool allNumbered = true;
    for (const KvCacheGroup& group : config.groups)
        for (const std::string& layer : group.layerNames) {
            const long n = indexInName(layer);
            allNumbered = allNumbered && n >= 0;
            numbered.emplace_back(n, layer);
            ++configOrder;
        }
    if (allNumbered)
        std::stable_sort(numbered.begin(), numbered.end(),
                         [](const auto& a, const auto& b) { return a.first < b.first; });
    std::vector<std::string> order;
    for (auto& [n, layer] : numbered)
        order.push_back(std::move(layer));
    return order;
}

float StateLayerAnalysis::worstRatio(std::size_t checkpoint, int* part, std::int64_t* unit) const
{
    float worst = std::numeric_limits<float>::quiet_NaN();
    for (std::size_t p = 0; p < parts.size(); ++p)
        for (std::int64_t u = 0; u < parts[p].units; ++u) {
            const float r = parts[p].at(parts[p].ratio, checkpoint, u);
            if (std::isfinite(r) && !(r <= worst)) {
                worst = r;
                if (part)
                    *part = int(p);
                if (unit)
                    *unit = u;
            }
        }
    return worst;
}

int StateLayerAnalysis::offCells(std::size_t checkpoint) const
{
    int off = 0;
    for (const StatePartAnalysis& part : parts)
        for (std::int64_t u = 0; u < part.units; ++u)
            off += part.at(part.ratio, checkpoint, u) > offThreshold;
    return off;
}

std::int64_t StateLayerAnalysis::cells() const
{
    std::int64_t n = 0;
    for (const StatePartAnalysis& part : parts)
        n += part.units * std::int64_t(positions.size());
    return n;
}

namespace {

// How many consecutive units of `size` values make a cell (groupSmallUnits).
std::int64_t cellRun(std::int64_t units, std::int64_t size)
{
    std::int64_t run = 1;
    while (run < units && (run * size < kStateCellValues || units % run != 0))
        ++run;
    return run;
}

// The cells a layer's comparison will have, from its layout alone: the checkpoints both sides
// hold, times each part's cells (what loadLayerState and groupSmallUnits make of it).
std::int64_t cellsOf(const std::pair<LayerStateRecord, std::optional<LayerStateRecord>>& layout)
{
    const auto& [engine, expected] = layout;
    if (!expected || expected->ranks.empty())
        return 0;
    std::int64_t checkpoints = 0;
    for (std::int64_t p : engine.positions)
        checkpoints += std::binary_search(expected->positions.begin(), expected->positions.end(), p);
    std::int64_t cells = 0;
    for (const StatePart& part : expected->ranks[0]) {
        const std::vector<std::int64_t>& shape = part.tensor.shape;
        std::int64_t size = 1;
        for (std::size_t d = 2; d < shape.size(); ++d)
            size *= shape[d];
        cells += shape.size() >= 2 ? shape[1] / cellRun(shape[1], size) : 0;
    }
    return checkpoints * cells;
}

}  // namespace

void groupSmallUnits(LayerState& state)
{
    for (StatePartValues& part : state.parts) {
        const std::int64_t units = part.units(), size = part.unitSize();
        const std::int64_t run = cellRun(units, size);
        if (run == 1)
            continue;
        part.unitsPerCell *= run;
        part.shape = {part.shape[0], units / run, run * size};
    }
}

StateLayerAnalysis analyzeLayerState(const LayerState& state, int modelIndex, const SuspectThresholds& thresholds,
                                     std::int64_t testedCells)
{
    StateLayerAnalysis a;
    a.layer = state.layer;
    a.kind = state.kind;
    a.modelIndex = modelIndex;
    a.positions = state.positions;
    a.uncompared = state.uncompared;
    a.threeWay = state.hasBaseline;
    a.replicaDifferences = state.replicaDifferences;
    // The floors are in the coarsest precision either side computes the state in: a float32 SSM
    // state is still fed bf16 activations when the conv state (the model dtype) is bf16.
    a.unitRoundoff = unitRoundoff(DType::Float32);
    for (const StatePartValues& part : state.parts)
        a.unitRoundoff = std::max({a.unitRoundoff, unitRoundoff(part.engineDType), unitRoundoff(part.referenceDType)});
    const double rounding = offThreshold(thresholds.offFloor, thresholds.perDecade, testedCells);
    a.offThreshold = rounding;
    if (!a.threeWay)  // the drift of two runs through the layers above, in bf16 roundoffs (off_floor.h)
        a.offThreshold += offThreshold(thresholds.twoWayDrift, thresholds.twoWayDriftPerDecade, testedCells) *
                          std::sqrt(double(modelIndex) + 1.0) * unitRoundoff(DType::BFloat16) / a.unitRoundoff;

    for (const StatePartValues& values : state.parts) {
        StatePartAnalysis part;
        part.name = values.name;
        part.units = values.units();
        part.unitsPerCell = values.unitsPerCell;
        part.engineDType = values.engineDType;
        const std::size_t cells = state.positions.size() * std::size_t(part.units);
        const float nan = std::numeric_limits<float>::quiet_NaN();
        for (auto* metric : {&part.relL2, &part.relLinf, &part.oneMinusCos, &part.floor, &part.ratio, &part.sizeRatio})
            metric->assign(cells, nan);
        if (a.threeWay)
            part.baseRelL2.assign(cells, nan);
        const std::int64_t n = values.unitSize();
        for (std::size_t cell = 0; cell < cells; ++cell) {
            const std::size_t at = cell * std::size_t(n);
            const float* engine = values.engine.data() + at;
            const float* expected = values.expected.data() + at;
            const float* baseline = a.threeWay ? values.baseline.data() + at : nullptr;
            const std::int64_t position = state.positions[cell / std::size_t(part.units)];
            const std::int64_t unit = std::int64_t(cell % std::size_t(part.units));
            bool allFinite = true;
            for (auto [side, v] : {std::pair{"actual", engine}, std::pair{"expected", expected}, std::pair{"baseline", baseline}})
                if (v && !finite(v, n)) {
                    a.nonFinite.push_back({part.name, position, unit, side});
                    allFinite = false;
                }
            if (!allFinite)
                continue;
            VectorComparison actual;
            compareVectors(expected, engine, int(n), actual);
            part.relL2[cell] = float(actual.l2);
            part.relLinf[cell] = float(actual.linf);
            part.oneMinusCos[cell] = float(1.0 - actual.cos);
            const double expectedNorm = l2Norm(expected, n);
            part.sizeRatio[cell] = float(l2Norm(engine, n) / std::max(expectedNorm, kRelativeEps));
            if (a.threeWay) {
                VectorComparison base, againstBaseline;
                compareVectors(baseline, expected, int(n), base);
                compareVectors(baseline, engine, int(n), againstBaseline);
                part.baseRelL2[cell] = float(base.l2);
                part.ratio[cell] = float(againstBaseline.l2);  // divided by the floor below
            } else {
                part.floor[cell] = float(a.unitRoundoff);
                part.ratio[cell] = float(actual.l2 / a.unitRoundoff);
            }
        }
        if (a.threeWay)
            for (std::size_t c = 0; c < state.positions.size(); ++c) {
                const std::size_t first = c * std::size_t(part.units), end = first + std::size_t(part.units);
                std::vector<double> base;
                for (std::size_t cell = first; cell < end; ++cell)
                    if (std::isfinite(part.baseRelL2[cell]))
                        base.push_back(part.baseRelL2[cell]);
                const double typical = base.empty() ? 0.0 : medianInPlace(base);
                for (std::size_t cell = first; cell < end; ++cell) {
                    part.floor[cell] = float(std::max({double(part.baseRelL2[cell]), typical, 0.25 * a.unitRoundoff}));
                    part.ratio[cell] = part.ratio[cell] / part.floor[cell];
                }
            }
        a.parts.push_back(std::move(part));
    }
    return a;
}

std::vector<StateLayerAnalysis> analyzePromptStates(const CaptureLoader& loader, const PromptInfo& prompt,
                                                    const std::vector<std::string>& modelOrder,
                                                    const SuspectThresholds& thresholds)
{
    std::vector<std::pair<int, std::string>> layers;
    for (const std::string& layer : prompt.stateLayers) {
        const auto at = std::find(modelOrder.begin(), modelOrder.end(), layer);
        layers.emplace_back(int(at - modelOrder.begin()), layer);
    }
    std::sort(layers.begin(), layers.end());
    // The threshold grows with every state cell of the prompt: counted from the layouts first,
    // then one layer's values in memory at a time.
    std::int64_t cells = 0;
    for (const auto& [index, layer] : layers) {
        try {
            cells += cellsOf(loader.stateLayout(prompt.id, layer));
        } catch (const BundleError&) {  // (said below, when its values are read)
        }
    }
    std::vector<StateLayerAnalysis> analysed;
    for (const auto& [index, layer] : layers) {
        try {
            LayerState state = loader.layerState(prompt.id, layer);
            groupSmallUnits(state);
            analysed.push_back(analyzeLayerState(state, index, thresholds, cells));
        } catch (const BundleError& e) {
            StateLayerAnalysis a;
            a.layer = layer;
            a.modelIndex = index;
            a.problem = e.what();
            analysed.push_back(std::move(a));
        }
    }
    return analysed;
}

}  // namespace kvscope
