#include "analysis/off_floor.h"

#include "util/work_team.h"

#include <algorithm>
#include <cmath>
#include <set>

namespace kvscope {

namespace {

constexpr double kTiny = 1e-10;

}  // namespace

void forEachLayer(WorkTeam* team, const PromptAnalysis& p, const std::function<void(int)>& fn)
{
    auto each = [&](int layer) {
        fn(layer);
        p.releaseLayer(layer);
    };
    const int layers = int(p.layers.size());
    if (team)
        team->run(layers, [&](int layer, int) { each(layer); });
    else
        for (int layer = 0; layer < layers; ++layer)
            each(layer);
}

double offThreshold(double floor, double perDecade, std::int64_t cells)
{
    return floor + perDecade * std::max(0.0, std::log10(double(std::max<std::int64_t>(cells, 1)) / 1000.0));
}

int noiseOffCells(std::int64_t layerCells, double threshold, const SuspectThresholds& th, double chance)
{
    // The clean tail: 1 cell in 1000 above offFloor, ten times fewer every perDecade floors.
    const double expected = double(layerCells) / 1000.0 * std::pow(10.0, -(threshold - th.offFloor) / th.perDecade);
    // The smallest k with P(Poisson(expected) >= k) < chance.
    double term = std::exp(-expected), below = 0;  // P(X = k), P(X < k)
    int k = 0;
    while (1.0 - below >= chance && k < 1000) {
        below += term;
        ++k;
        term *= expected / double(k);
    }
    return k;
}

double cellFloor(const PromptAnalysis& p, KvPart part, int layer, std::int64_t token)
{
    const DType dtype = std::size_t(layer) < p.layerDtypes.size() ? p.layerDtypes[std::size_t(layer)] : DType::BFloat16;
    double floor;
    if (p.threeWay)
        floor = noiseFloor(p, metricFor(part, MetricKind::Linf), layer, token);
    else if (p.hasQuantisedLayers() && isQuantised(dtype)) {
        floor = p.quantFloor(part, MetricKind::L2, layer, token);  // what storing the reference costs (NaN: no data)
        if (std::isnan(floor))  // the layer's other part, unquantised (a v_dtype), where it has data
            for (int h = 0; h < p.heads && std::isnan(floor); ++h)
                if (std::isfinite(p.value(metricFor(part, MetricKind::L2), layer, token, h)))
                    floor = unitRoundoff(DType::BFloat16);
    } else
        floor = unitRoundoff(dtype);
    return std::isnan(floor) ? floor : std::max(floor, kTiny);
}

CellRatios::CellRatios(const PromptAnalysis& p, WorkTeam* team)
    : m_p(p)
{
    const int layers = int(p.layers.size());
    for (KvPart part : {KvPart::K, KvPart::V}) {
        std::vector<double>& floors = m_floors[std::size_t(part)];
        floors.resize(std::size_t(layers) * std::size_t(p.tokens));
        forEachLayer(team, p, [&](int l) {
            for (std::int64_t t = 0; t < p.tokens; ++t)
                floors[std::size_t(l) * std::size_t(p.tokens) + std::size_t(t)] = cellFloor(p, part, l, t);
        });
    }
}

double CellRatios::floorOf(int layer, std::int64_t token, KvPart part) const
{
    return m_floors[std::size_t(part)][std::size_t(layer) * std::size_t(m_p.tokens) + std::size_t(token)];
}

float CellRatios::at(int layer, std::int64_t token, int head, KvPart part) const
{
    const Metric m = metricFor(part, m_p.threeWay ? MetricKind::Linf : MetricKind::L2);
    return float(double(m_p.value(m, layer, token, head)) / floorOf(layer, token, part));
}

double CellRatios::between(int layer, std::int64_t token, KvPart part, const float* reference, const float* predicted,
                           const float* actual, int dim) const
{
    // The analysis's own definitions (metrics/vector_metrics.h): L-inf relative to max|ref|,
    // L2 relative to ||ref||.
    double maxRef = 0, maxDiff = 0, ref2 = 0, diff2 = 0;
    for (int i = 0; i < dim; ++i) {
        const double r = reference[i], d = double(actual[i]) - double(predicted[i]);
        maxRef = std::max(maxRef, std::fabs(r));
        maxDiff = std::max(maxDiff, std::fabs(d));
        ref2 += r * r;
        diff2 += d * d;
    }
    const double relative = m_p.threeWay ? maxDiff / std::max(maxRef, kTiny) : std::sqrt(diff2) / std::max(std::sqrt(ref2), kTiny);
    return relative / floorOf(layer, token, part);
}

double cleanLevel(const OffFloor& floor, const PromptAnalysis& p, int layer)
{
    const auto index = [&](std::int64_t t, int h, KvPart part) {
        return (std::size_t(t) * std::size_t(p.heads) + std::size_t(h)) * 2 + std::size_t(part);
    };
    for (int l = layer; l >= 0; --l) {
        const std::vector<OffCell>& off = floor.cells[std::size_t(l)];
        std::vector<char> isOff(std::size_t(p.tokens) * std::size_t(p.heads) * 2, 0);
        for (const OffCell& c : off)
            isOff[index(c.token, c.head, c.part)] = 1;
        std::vector<double> clean;
        for (std::int64_t t = 0; t < p.tokens; ++t)
            for (int h = 0; h < p.heads; ++h)
                for (KvPart part : {KvPart::K, KvPart::V})
                    if (const float r = floor.ratios.at(l, t, h, part); std::isfinite(r) && !isOff[index(t, h, part)])
                        clean.push_back(r);
        p.releaseLayer(l);
        if (!clean.empty() && clean.size() * 10 >= off.size() + clean.size())
            return std::max(1.0, median(clean));
    }
    return 1.0;
}

CellRatioMaxima cellRatioMaxima(const PromptAnalysis& p, WorkTeam* team)
{
    const CellRatios ratios(p, team);
    CellRatioMaxima maxima;
    for (std::vector<float>& part : maxima)
        part.assign(p.layers.size() * std::size_t(p.tokens), std::nanf(""));
    forEachLayer(team, p, [&](int l) {
        for (KvPart part : {KvPart::K, KvPart::V})
            for (std::int64_t t = 0; t < p.tokens; ++t) {
                float most = std::nanf("");
                for (int h = 0; h < p.headsOf(l); ++h)
                    if (const float r = ratios.at(l, t, h, part); std::isfinite(r) && !(r <= most))
                        most = r;
                maxima[std::size_t(part)][std::size_t(l) * std::size_t(p.tokens) + std::size_t(t)] = most;
            }
    });
    return maxima;
}

std::vector<std::int64_t> finiteCells(const PromptAnalysis& p, const std::vector<char>* layersReady, WorkTeam* team)
{
    std::vector<std::int64_t> finite(p.layers.size(), 0);
    forEachLayer(team, p, [&](int l) {
        if (!layerIsReady(layersReady, l))
            return;
        const Metric m = metricFor(KvPart::K, MetricKind::L2);
        std::int64_t n = 0;
        for (std::int64_t t = 0; t < p.tokens; ++t)
            for (int h = 0; h < p.heads; ++h)
                n += std::isfinite(p.value(m, l, t, h)) ? 2 : 0;
        finite[std::size_t(l)] = n;
    });
    return finite;
}

namespace {

// The median floor of a finished layer's cells (two-way: the dtype's, or a quantised cache's);
// NaN for a layer still being written.
double typicalFloor(const PromptAnalysis& p, int layer, const std::vector<char>* layersReady)
{
    if (!layerIsReady(layersReady, layer))
        return std::nan("");
    std::vector<double> floors;
    for (KvPart part : {KvPart::K, KvPart::V})
        for (std::int64_t t = 0; t < p.tokens; ++t)
            if (const double f = cellFloor(p, part, layer, t); std::isfinite(f))
                floors.push_back(f);
    p.releaseLayer(layer);
    return medianInPlace(floors);
}

}  // namespace

std::vector<double> layerOffThresholds(const PromptAnalysis& p, const SuspectThresholds& th, std::int64_t tested,
                                       const std::vector<char>* layersReady)
{
    // Rounding's tail in the cell's floors; two-way also the drift, in bf16 unit roundoffs.
    const double rounding = offThreshold(th.offFloor, th.perDecade, tested);
    const double drift = offThreshold(th.twoWayDrift, th.twoWayDriftPerDecade, tested);
    std::vector<double> thresholds;
    for (int l = 0; l < int(p.layers.size()); ++l) {
        if (p.threeWay) {
            thresholds.push_back(rounding);
            continue;
        }
        // The drift, in bf16 unit roundoffs, in this layer's floors (a quantised cache's are coarser).
        const double floor = typicalFloor(p, l, layersReady);
        thresholds.push_back(rounding + drift * std::sqrt(double(l) + 1.0) * unitRoundoff(DType::BFloat16) /
                                            (std::isfinite(floor) ? floor : unitRoundoff(DType::BFloat16)));
    }
    return thresholds;
}

namespace {

std::int64_t testedCells(const PromptAnalysis& p, const std::vector<char>* layersReady)
{
    std::int64_t tested = 0;
    for (std::int64_t n : finiteCells(p, layersReady))
        tested += n;
    return tested;
}

}  // namespace

std::vector<double> mapOffThresholds(const PromptAnalysis& p, const SuspectThresholds& th, const std::vector<char>* layersReady)
{
    return layerOffThresholds(p, th, std::int64_t(double(testedCells(p, layersReady)) * kMapNoiseCaptures), layersReady);
}

void useSuspectThresholds(const PromptAnalysis& p, const SuspectThresholds& th, const std::vector<char>* layersReady,
                          std::vector<double>& thresholds)
{
    if (p.suspects.empty())
        return;
    const std::vector<double> own = layerOffThresholds(p, th, testedCells(p, layersReady), layersReady);
    for (const Suspect& s : p.suspects)
        for (const std::string& layer : s.layers)
            if (const auto at = std::find(p.layers.begin(), p.layers.end(), layer); at != p.layers.end()) {
                const std::size_t l = std::size_t(at - p.layers.begin());
                if (l < thresholds.size() && l < own.size())
                    thresholds[l] = std::min(thresholds[l], own[l]);
            }
}

std::vector<double> finalMapOffThresholds(const PromptAnalysis& p, const SuspectThresholds& th)
{
    std::vector<double> thresholds = mapOffThresholds(p, th, nullptr);
    useSuspectThresholds(p, th, nullptr, thresholds);
    return thresholds;
}

OffFloor findOffFloor(const PromptAnalysis& p, const SuspectThresholds& th, const std::vector<char>* layersReady,
                      WorkTeam* team, const EarlierRun* earlier)
{
    OffFloor result{CellRatios(p, team), 0, {}, {}, {}};
    const CellRatios& ratios = result.ratios;
    const int layers = int(p.layers.size());
    auto ready = [&](int l) { return layerIsReady(layersReady, l); };

    // The cells tested: every finite cell of the finished layers.
    const std::vector<std::int64_t> finite = finiteCells(p, layersReady, team);
    for (std::int64_t n : finite)
        result.tested += n;
    result.threshold = layerOffThresholds(p, th, result.tested, layersReady);

    // Off cells per layer; affected layers.
    std::vector<std::vector<OffCell>>& off = result.cells;
    off.resize(std::size_t(layers));
    forEachLayer(team, p, [&](int l) {
        if (!ready(l))
            return;
        for (std::int64_t t = 0; t < p.tokens; ++t)
            for (int h = 0; h < p.heads; ++h)
                for (KvPart part : {KvPart::K, KvPart::V}) {
                    const float r = ratios.at(l, t, h, part);
                    if (!std::isfinite(r))
                        continue;
                    if (r > result.threshold[std::size_t(l)] && (!earlier || earlier->allows(p, l, t, part, r)))
                        off[std::size_t(l)].push_back({t, h, part, r});
                }
    });
    // Coherence: a real onset persists over tokens or layers. Cells off at one token of one
    // layer only (a token whose floor happens to be tiny) are not a fault.
    std::vector<std::set<std::int64_t>> tokens(static_cast<std::size_t>(layers));
    for (int l = 0; l < layers; ++l)
        for (const OffCell& c : off[std::size_t(l)])
            tokens[std::size_t(l)].insert(c.token);
    // (No more cells than one token holds: an MLA latent has two, c_kv and k_pe.) And more than
    // noise alone would put there: a long capture of one full-attention layer holds every clean
    // cell the threshold lets through.
    int layersTested = 0;
    for (int l = 0; l < layers; ++l)
        layersTested += finite[std::size_t(l)] > 0 ? 1 : 0;
    for (int l = 0; l < layers; ++l) {
        const std::size_t minCells = std::max<std::size_t>(
            std::min<std::size_t>(std::size_t(th.minCells), std::size_t(2 * p.headsOf(l))),
            std::size_t(noiseOffCells(finite[std::size_t(l)], result.threshold[std::size_t(l)], th,
                                      th.falseLayerChance / std::max(1, layersTested))));
        if (off[std::size_t(l)].size() < minCells)
            continue;
        bool persists = tokens[std::size_t(l)].size() >= 2;
        for (int other = 0; other < layers && !persists; ++other)
            persists = other != l && tokens[std::size_t(other)].count(*tokens[std::size_t(l)].begin()) > 0;
        if (persists)
            result.affected.push_back(l);
    }
    return result;
}

}  // namespace kvscope
