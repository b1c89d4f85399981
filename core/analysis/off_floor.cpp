#include "analysis/off_floor.h"

#include "util/work_team.h"

#include <algorithm>
#include <cmath>

namespace kvscope {

namespace {

// The median of `v`, which it reorders.
double medianOf(std::vector<double>& v)
{
    if (v.empty())
        return std::nan("");
    const auto mid = v.begin() + std::ptrdiff_t(v.size() / 2);
    std::nth_element(v.begin(), mid, v.end());
    return *mid;
}

}  // namespace

void forEachLayer(WorkTeam* team, int layers, const std::function<void(int)>& fn)
{
    if (team)
        team->run(layers, [&](int layer, int) { fn(layer); });
    else
        for (int layer = 0; layer < layers; ++layer)
            fn(layer);
}

double median(std::vector<double> values)
{
    return medianOf(values);
}

CellRatios::CellRatios(const PromptAnalysis& p, double layerJump, WorkTeam* team)
    : m_p(p)
{
    const int layers = int(p.layers.size());
    for (KvPart part : {KvPart::K, KvPart::V}) {
        const Metric m = metricFor(part, MetricKind::Linf);
        std::vector<double>& floors = m_floors[std::size_t(part)];
        if (p.threeWay) {
            floors.resize(std::size_t(layers) * std::size_t(p.tokens));
            forEachLayer(team, layers, [&](int l) {
                for (std::int64_t t = 0; t < p.tokens; ++t)
                    floors[std::size_t(l) * std::size_t(p.tokens) + std::size_t(t)] =
                        std::max(double(noiseFloor(p, m, l, t)), 1e-10);
            });
            continue;
        }
        floors.assign(std::size_t(layers), std::nan(""));
        forEachLayer(team, layers, [&](int l) {
            std::vector<double> values;
            for (std::int64_t t = 0; t < p.tokens; ++t)
                for (int h = 0; h < p.heads; ++h)
                    if (const float v = p.value(m, l, t, h); std::isfinite(v))
                        values.push_back(v);
            if (!values.empty())
                floors[std::size_t(l)] = std::max(median(values), 1e-10);
        });
        std::vector<double> medians;
        for (double floor : floors)
            if (!std::isnan(floor))
                medians.push_back(floor);
        const double typical = median(medians);
        for (double& floor : floors)
            if (floor > layerJump * typical)
                floor = typical;
    }
}

float CellRatios::at(int layer, std::int64_t token, int head, KvPart part) const
{
    const Metric m = metricFor(part, MetricKind::Linf);
    const std::vector<double>& floors = m_floors[std::size_t(part)];
    const double floor = m_p.threeWay ? floors[std::size_t(layer) * std::size_t(m_p.tokens) + std::size_t(token)]
                                      : floors[std::size_t(layer)];
    return float(double(m_p.value(m, layer, token, head)) / floor);
}

OffFloor findOffFloor(const PromptAnalysis& p, const SuspectThresholds& th, const std::vector<char>* layersReady,
                      WorkTeam* team)
{
    OffFloor result{CellRatios(p, th.layerJump, team), {}, {}, {}};
    const CellRatios& ratios = result.ratios;
    std::vector<double>* const threshold = result.threshold;
    const int layers = int(p.layers.size());
    auto ready = [&](int l) { return layerIsReady(layersReady, l); };

    // The typical ratio per layer and part: a cache noisier everywhere (fp8, whose noise
    // follows each layer's scale) sets its own floor, unless the layer's typical ratio is far
    // above the capture's (the whole layer is off): then the capture's.
    for (KvPart part : {KvPart::K, KvPart::V}) {
        std::vector<double> typical(static_cast<std::size_t>(layers), std::nan(""));
        forEachLayer(team, layers, [&](int l) {
            if (!ready(l))
                return;
            thread_local std::vector<double> all;  // a layer's ratios, the buffer kept
            all.clear();
            all.reserve(std::size_t(p.tokens) * std::size_t(p.heads));
            for (std::int64_t t = 0; t < p.tokens; ++t)
                for (int h = 0; h < p.heads; ++h)
                    if (const float r = ratios.at(l, t, h, part); std::isfinite(r))
                        all.push_back(r);
            if (!all.empty())
                typical[std::size_t(l)] = medianOf(all);
        });
        std::vector<double> typicals;
        for (double t : typical)
            if (!std::isnan(t))
                typicals.push_back(t);
        const double overall = typicals.empty() ? 1.0 : median(typicals);
        for (int l = 0; l < layers; ++l) {
            double t = std::isnan(typical[std::size_t(l)]) ? overall : typical[std::size_t(l)];
            if (t > th.layerJump * overall)
                t = overall;
            threshold[std::size_t(part)].push_back((p.threeWay ? th.offFloor : th.twoWayFloor) *
                                                   (p.threeWay ? std::max(1.0, t) : 1.0));
        }
    }

    // Off cells per layer; affected layers.
    std::vector<std::vector<OffCell>>& off = result.cells;
    off.resize(std::size_t(layers));
    std::vector<char> layerAffected(static_cast<std::size_t>(layers), 0);
    forEachLayer(team, layers, [&](int l) {
        if (!ready(l))
            return;
        std::int64_t cells = 0;
        for (std::int64_t t = 0; t < p.tokens; ++t)
            for (int h = 0; h < p.heads; ++h)
                for (KvPart part : {KvPart::K, KvPart::V}) {
                    const float r = ratios.at(l, t, h, part);
                    if (!std::isfinite(r))
                        continue;
                    ++cells;
                    if (r > threshold[std::size_t(part)][std::size_t(l)])
                        off[std::size_t(l)].push_back({t, h, part, r});
                }
        const std::size_t n = off[std::size_t(l)].size();
        layerAffected[std::size_t(l)] = n >= std::size_t(th.minCells) && double(n) >= th.minFraction * double(cells);
    });
    for (int l = 0; l < layers; ++l)
        if (layerAffected[std::size_t(l)])
            result.affected.push_back(l);
    return result;

}

}  // namespace kvscope
