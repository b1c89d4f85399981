#include "analysis/heatmap_grid.h"

#include "analysis/off_floor.h"

#include <algorithm>
#include <cmath>
#include <optional>

namespace kvscope {

bool lowerIsWorse(HeatmapMetric metric)
{
    return metric == HeatmapMetric::Bc || metric == HeatmapMetric::BcVsNoise;
}

std::string heatmapMetricName(HeatmapMetric metric)
{
    switch (metric) {
    case HeatmapMetric::RelLinf:
        return "relative L-inf";
    case HeatmapMetric::RelL2:
        return "relative L2";
    case HeatmapMetric::OneMinusCos:
        return "1 - cosine";
    case HeatmapMetric::ErrorRatio:
        return "error in noise floors";
    case HeatmapMetric::Bc:
        return "Bhattacharyya coefficient (reference tool)";
    case HeatmapMetric::BcVsNoise:
        return "BC against the noise floor";
    }
    return "?";
}

std::string heatmapMetricShortName(HeatmapMetric metric)
{
    switch (metric) {
    case HeatmapMetric::ErrorRatio:
        return "error in floors";
    case HeatmapMetric::Bc:
        return "BC, reference tool's (3-way)";
    case HeatmapMetric::BcVsNoise:
        return "BC vs noise (3-way)";
    default:
        return heatmapMetricName(metric);
    }
}

namespace {

// An error metric (L-inf, L2, cos shown as 1 - cos) of `m` reduced over heads as `spec` says.
float reducedError(const PromptAnalysis& p, const HeatmapSpec& spec, Metric m, int layer, std::int64_t token, int* head)
{
    const bool invert = m == Metric::KCos || m == Metric::VCos || m == Metric::BaseKCos || m == Metric::BaseVCos;
    switch (spec.reduction) {
    case HeadReductionKind::Max: {
        const HeadReduction r = invert ? minOverHeads(p, m, layer, token) : maxOverHeads(p, m, layer, token);
        if (head)
            *head = r.head;
        return invert ? 1.0f - r.value : r.value;
    }
    case HeadReductionKind::Mean: {
        const float mean = meanOverHeads(p, m, layer, token);
        return invert ? 1.0f - mean : mean;
    }
    case HeadReductionKind::OneHead: {
        if (spec.head < 0 || spec.head >= p.heads)
            return std::nanf("");
        if (head)
            *head = spec.head;
        const float v = p.value(m, layer, token, spec.head);
        return invert ? 1.0f - v : v;
    }
    }
    return std::nanf("");
}

std::optional<MetricKind> errorKind(HeatmapMetric metric)
{
    switch (metric) {
    case HeatmapMetric::RelLinf:
        return MetricKind::Linf;
    case HeatmapMetric::RelL2:
        return MetricKind::L2;
    case HeatmapMetric::OneMinusCos:
        return MetricKind::Cos;
    default:
        return std::nullopt;
    }
}

}  // namespace

float heatmapBaseValue(const PromptAnalysis& p, const HeatmapSpec& spec, int layer, std::int64_t token)
{
    const std::optional<MetricKind> kind = errorKind(spec.metric);
    if (!kind || !p.threeWay)
        return std::nanf("");
    return reducedError(p, spec, baseOf(metricFor(spec.part, *kind)), layer, token, nullptr);
}

namespace {

// Two-way, a cell's error in floors as the suspects take it (off_floor.h): its relative L2 over
// the cache dtype's floor.
float twoWayRatio(const PromptAnalysis& p, const HeatmapSpec& spec, int layer, std::int64_t token, int* head)
{
    const double floor = cellFloor(p, spec.part, layer, token);
    const Metric l2 = metricFor(spec.part, MetricKind::L2);
    const auto ratio = [&](int h) { return float(double(p.value(l2, layer, token, h)) / floor); };
    switch (spec.reduction) {
    case HeadReductionKind::OneHead:
        if (spec.head < 0 || spec.head >= p.headsOf(layer))
            return std::nanf("");
        if (head)
            *head = spec.head;
        return ratio(spec.head);
    case HeadReductionKind::Max:
    case HeadReductionKind::Mean: {
        float most = std::nanf("");
        double sum = 0;
        int n = 0;
        for (int h = 0; h < p.headsOf(layer); ++h)
            if (const float r = ratio(h); std::isfinite(r)) {
                sum += r;
                ++n;
                if (!(r <= most)) {
                    most = r;
                    if (head)
                        *head = h;
                }
            }
        if (spec.reduction == HeadReductionKind::Mean && head)
            *head = -1;
        return spec.reduction == HeadReductionKind::Max ? most : n ? float(sum / n) : std::nanf("");
    }
    }
    return std::nanf("");
}

}  // namespace

void divideRows(HeatmapGrid& grid, const std::vector<double>& byRow, int firstRow)
{
    for (int r = 0; r < grid.rows; ++r) {
        const auto d = float(byRow[std::size_t(firstRow + r)]);
        for (std::int64_t c = 0; c < grid.columns; ++c)
            grid.values[std::size_t(r) * std::size_t(grid.columns) + std::size_t(c)] /= d;
    }
}

float heatmapValue(const PromptAnalysis& p, const HeatmapSpec& spec, int layer, std::int64_t token, int* head)
{
    if (head)
        *head = -1;
    const KvPart part = spec.part;
    if (const std::optional<MetricKind> kind = errorKind(spec.metric))
        return reducedError(p, spec, metricFor(part, *kind), layer, token, head);
    switch (spec.metric) {
    case HeatmapMetric::Bc:
        return p.threeWay ? p.bcValue(part, layer, token) : std::nanf("");
    case HeatmapMetric::BcVsNoise:
        return p.threeWay ? p.bcVsNoiseValue(part, layer, token) : std::nanf("");
    case HeatmapMetric::ErrorRatio: {
        if (!p.threeWay)
            return twoWayRatio(p, spec, layer, token, head);
        const Metric actual = metricFor(part, MetricKind::Linf);
        switch (spec.reduction) {
        case HeadReductionKind::Max: {
            const HeadReduction r = errorRatio(p, actual, layer, token);
            if (head)
                *head = r.head;
            return r.value;
        }
        case HeadReductionKind::Mean:
            return meanErrorRatio(p, actual, layer, token);
        case HeadReductionKind::OneHead:
            if (spec.head < 0 || spec.head >= p.heads)
                return std::nanf("");
            if (head)
                *head = spec.head;
            return headErrorRatio(p, actual, layer, token, spec.head);
        }
        return std::nanf("");
    }
    default:
        return std::nanf("");  // the error metrics, above
    }
}

namespace {

// Tokens [0, tokens) of one layer's row, as the heatmap shows them.
void fillHeatmapRow(const PromptAnalysis& p, const HeatmapSpec& spec, int layer, std::int64_t tokens, float* values,
                    std::int16_t* heads)
{
    for (std::int64_t t = 0; t < tokens; ++t) {
        int head = -1;
        values[t] = heatmapValue(p, spec, layer, t, &head);
        heads[t] = std::int16_t(head);
    }
}

}  // namespace

HeatmapGrid buildHeatmap(const PromptAnalysis& p, const HeatmapSpec& spec, const std::vector<char>* rowsReady)
{
    HeatmapGrid g;
    g.rows = int(p.layers.size());
    g.columns = p.tokens;
    g.values.assign(std::size_t(g.rows) * std::size_t(g.columns), std::nanf(""));
    g.heads.assign(g.values.size(), -1);
    for (int l = 0; l < g.rows; ++l) {
        const bool ready = !rowsReady || (std::size_t(l) < rowsReady->size() && (*rowsReady)[std::size_t(l)]);
        if (!ready)
            continue;
        const std::size_t row = std::size_t(l) * std::size_t(g.columns);
        fillHeatmapRow(p, spec, l, g.columns, &g.values[row], &g.heads[row]);
        p.releaseLayer(l);
    }
    return g;
}

HeatmapGrid heatmapRowStart(const PromptAnalysis& p, const HeatmapSpec& spec, int layer, std::int64_t tokens)
{
    HeatmapGrid g;
    g.rows = 1;
    g.columns = std::clamp<std::int64_t>(tokens, 0, p.tokens);
    g.values.resize(std::size_t(g.columns));
    g.heads.resize(std::size_t(g.columns));
    fillHeatmapRow(p, spec, layer, g.columns, g.values.data(), g.heads.data());
    return g;
}

HeatmapGrid poolRuns(const HeatmapGrid& grid, std::int64_t first, std::int64_t last, std::int64_t run, bool lowerWorse)
{
    HeatmapGrid out;
    out.rows = grid.rows;
    out.columns = (last - first + run - 1) / run;
    out.firstToken = grid.firstToken + first * grid.tokensPerColumn;
    out.tokensPerColumn = grid.tokensPerColumn * run;
    out.values.assign(std::size_t(out.rows) * std::size_t(out.columns), std::nanf(""));
    out.heads.assign(out.values.size(), -1);
    for (int r = 0; r < grid.rows; ++r)
        for (std::int64_t c = 0; c < out.columns; ++c) {
            const std::size_t at = std::size_t(r) * std::size_t(out.columns) + std::size_t(c);
            for (std::int64_t k = first + c * run; k < std::min(last, first + (c + 1) * run); ++k) {
                const float v = grid.at(r, k);
                if (!std::isnan(v) && (std::isnan(out.values[at]) || (lowerWorse ? v < out.values[at] : v > out.values[at]))) {
                    out.values[at] = v;
                    out.heads[at] = grid.headAt(r, k);
                }
            }
        }
    return out;
}

HeatmapGrid poolColumns(const HeatmapGrid& grid, std::int64_t from, std::int64_t to, std::int64_t maxColumns,
                        bool lowerWorse)
{
    from = std::clamp<std::int64_t>(from, 0, grid.columns);
    to = std::clamp<std::int64_t>(to, from, grid.columns);
    maxColumns = std::max<std::int64_t>(maxColumns, 1);
    const std::int64_t run = std::max<std::int64_t>(1, (to - from + maxColumns - 1) / maxColumns);
    return poolRuns(grid, from, to, run, lowerWorse);
}

HeatmapGrid aggregateHeatmap(const AnalysisResult& result, KvPart part, bool vsNoise)
{
    const AggregateBc& aggregate = *result.aggregate;
    HeatmapGrid g;
    g.rows = int(aggregate.layers.size());
    g.columns = aggregate.generationCount;
    g.values = vsNoise ? aggregate.bcVsNoise[std::size_t(part)] : aggregate.bc[std::size_t(part)];
    if (vsNoise && !generationBcMeaningful(result))
        std::fill(g.values.begin(), g.values.end(), std::nanf(""));
    g.heads.assign(g.values.size(), -1);
    return g;
}

}  // namespace kvscope
