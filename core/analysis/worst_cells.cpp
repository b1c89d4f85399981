#include "analysis/worst_cells.h"

#include "analysis/off_floor.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <set>
#include <tuple>

namespace kvscope {

namespace {

bool isReady(const std::vector<char>* layersReady, int l)
{
    return !layersReady || (std::size_t(l) < layersReady->size() && (*layersReady)[std::size_t(l)]);
}

WorstCell nonFiniteCell(const NonFiniteCell& c)
{
    WorstCell w{c.layer, c.token, c.head, c.part};
    w.error = c.value == "inf" || c.value == "-inf" ? std::numeric_limits<float>::infinity() : std::nanf("");
    w.baseError = std::nanf("");
    w.ratio = std::numeric_limits<float>::infinity();
    w.nonFinite = true;
    w.side = c.side;
    w.value = c.value;
    return w;
}

}  // namespace

std::vector<WorstCell> worstCells(const PromptAnalysis& p, std::size_t count, const std::vector<char>* layersReady)
{
    // The `count` best kept as they come (a heap whose front is the last of them), not every
    // (layer, token): 10 million at 80 layers x 128k tokens.
    const auto ranksBefore = [](const WorstCell& a, const WorstCell& b) {
        return a.ratio != b.ratio ? a.ratio > b.ratio : std::tie(a.layer, a.token) < std::tie(b.layer, b.token);
    };
    // A NaN or infinity first (nonFinite is in layer, token, head, part, side order).
    std::vector<WorstCell> nonFinite;
    std::set<std::pair<int, std::int64_t>> listed;
    for (const NonFiniteCell& c : p.nonFinite) {
        if (!isReady(layersReady, c.layer) || c.layer >= int(p.layers.size()))
            continue;
        if (!listed.insert({c.layer, c.token}).second) {
            if (c.side == "actual" && nonFinite.back().side != "actual")  // the engine's own first
                nonFinite.back() = nonFiniteCell(c);
            continue;
        }
        nonFinite.push_back(nonFiniteCell(c));
    }
    if (nonFinite.size() >= count) {
        nonFinite.resize(count);
        return nonFinite;
    }
    count -= nonFinite.size();
    std::vector<WorstCell> cells;
    for (int l = 0; l < int(p.layers.size()); ++l) {
        if (!isReady(layersReady, l))
            continue;
        for (std::int64_t t = 0; t < p.tokens; ++t) {
            if (listed.count({l, t}))
                continue;
            WorstCell best;
            bool found = false;
            for (KvPart part : {KvPart::K, KvPart::V}) {
                const Metric m = metricFor(part, p.threeWay ? MetricKind::Linf : MetricKind::L2);
                // The cell's worst head, by the number the list ranks by.
                const HeadReduction r = p.threeWay ? errorRatio(p, m, l, t) : maxOverHeads(p, m, l, t);
                if (r.head < 0)
                    continue;
                const float floor = p.threeWay ? noiseFloor(p, m, l, t) : float(cellFloor(p, part, l, t));
                const float error = p.value(m, l, t, r.head);
                const WorstCell c{l, t, r.head, part, error, floor, p.threeWay ? r.value : error / floor};
                if (std::isnan(c.ratio))  // no floor: nothing to rank by
                    continue;
                if (!found || c.ratio > best.ratio)
                    best = c;
                found = true;
            }
            if (!found || count == 0)
                continue;
            cells.push_back(best);
            std::push_heap(cells.begin(), cells.end(), ranksBefore);
            if (cells.size() > count) {
                std::pop_heap(cells.begin(), cells.end(), ranksBefore);
                cells.pop_back();
            }
        }
        p.releaseLayer(l);
    }
    std::sort_heap(cells.begin(), cells.end(), ranksBefore);
    nonFinite.insert(nonFinite.end(), cells.begin(), cells.end());
    return nonFinite;
}

std::string nonFiniteText(const WorstCell& c)
{
    return c.value == "nan" ? "NaN" : c.value.empty() ? "NaN/inf" : c.value;
}

std::string nonFiniteSideText(const WorstCell& c)
{
    return nonFiniteText(c) + " (" + (c.side == "actual" ? "engine" : c.side) + ")";
}

const char* worstCellStatistic(const PromptAnalysis& p)
{
    return p.threeWay ? "relative L-inf" : "relative L2";
}

}  // namespace kvscope
