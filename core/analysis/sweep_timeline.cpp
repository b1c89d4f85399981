#include "analysis/sweep_timeline.h"

#include "analysis/off_floor.h"

#include <algorithm>
#include <cstdio>
#include <ctime>
#include <numeric>
#include <sstream>
#include <iomanip>

namespace kvscope {

namespace {

struct PromptStats {
    float worstRatio = std::nanf("");
    std::int64_t cells = 0, off = 0;
    std::vector<float> layerOff;  // [layer]: worst ratio over the layer's off threshold
};

PromptStats statsOf(const PromptAnalysis& p, const SuspectThresholds& thresholds)
{
    PromptStats s;
    s.layerOff.assign(p.layers.size(), std::nanf(""));
    const std::vector<double> offAt = finalMapOffThresholds(p, thresholds);
    const CellRatioMaxima ratios = cellRatioMaxima(p);
    for (std::size_t l = 0; l < p.layers.size(); ++l)
        for (std::int64_t t = 0; t < p.tokens; ++t)
            for (const std::vector<float>& part : ratios) {
                const float r = part[l * std::size_t(p.tokens) + std::size_t(t)];
                if (!std::isfinite(r))
                    continue;
                ++s.cells;
                s.off += l < offAt.size() && double(r) > offAt[l] ? 1 : 0;
                if (!(r <= s.worstRatio))
                    s.worstRatio = r;
                if (const float overOff = l < offAt.size() ? float(double(r) / offAt[l]) : std::nanf(""); !(overOff <= s.layerOff[l]))
                    s.layerOff[l] = overOff;
            }
    return s;
}

void add(TimelinePoint& point, const PromptAnalysis& p, const PromptStats& s, std::int64_t& cells, std::int64_t& off)
{
    ++point.prompts;
    // (layers by position: the prompts of a sweep are of one model, analysed with one layer selection)
    if (point.layerOff.size() < s.layerOff.size())
        point.layerOff.resize(s.layerOff.size(), std::nanf(""));
    for (std::size_t l = 0; l < s.layerOff.size(); ++l)
        if (std::isfinite(s.layerOff[l]) && !(s.layerOff[l] <= point.layerOff[l]))
            point.layerOff[l] = s.layerOff[l];
    if (std::isfinite(s.worstRatio) && !(s.worstRatio <= point.worstRatio))
        point.worstRatio = s.worstRatio;
    cells += s.cells;
    off += s.off;
    point.suspects += p.suspects.empty() ? 0 : 1;
}

std::vector<double> ranks(const std::vector<double>& v)
{
    std::vector<std::size_t> order(v.size());
    std::iota(order.begin(), order.end(), 0);
    std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return v[a] < v[b]; });
    std::vector<double> r(v.size());
    for (std::size_t i = 0; i < order.size();) {
        std::size_t j = i;
        while (j + 1 < order.size() && v[order[j + 1]] == v[order[i]])
            ++j;
        for (std::size_t k = i; k <= j; ++k)
            r[order[k]] = (double(i) + double(j)) / 2;
        i = j + 1;
    }
    return r;
}

std::string number(double v)
{
    std::ostringstream s;
    s << std::setprecision(3) << v;
    return s.str();
}

}  // namespace

HeatmapGrid timelineGrid(const SweepTimeline& t)
{
    HeatmapGrid g;
    g.rows = int(t.layers.size());
    g.columns = std::int64_t(t.points.size());
    g.values.assign(std::size_t(g.rows) * t.points.size(), std::nanf(""));
    g.heads.assign(g.values.size(), -1);
    for (std::size_t c = 0; c < t.points.size(); ++c)
        for (std::size_t l = 0; l < t.points[c].layerOff.size() && l < t.layers.size(); ++l)
            g.values[l * t.points.size() + c] = t.points[c].layerOff[l];
    return g;
}

MapSpec timelineMapSpec(const SweepTimeline& t)
{
    MapSpec s;
    const std::string unit = t.perBundle ? "capture" : "request";
    s.title = "Over time: each layer's worst cell per " + unit + (t.byTime ? ", in order of capture time" : ", in order");
    s.metricLabel = "worst cell over the layer's off threshold";
    s.xName = s.xLabel = unit;
    s.scale = ScaleKind::Ratio;
    s.range = defaultRange(ScaleKind::Ratio);
    for (const std::string& layer : t.layers) {
        s.rowLabels.push_back(shortLayerName(layer));
        s.layerNames.push_back(layer);
    }
    for (const TimelinePoint& p : t.points)
        s.tokenText.push_back(p.name);
    return s;
}

std::optional<double> isoSeconds(const std::string& text)
{
    int year = 0, month = 0, day = 0, hour = 0, minute = 0, consumed = 0;
    double second = 0;
    if (std::sscanf(text.c_str(), "%4d-%2d-%2dT%2d:%2d:%lf%n", &year, &month, &day, &hour, &minute, &second, &consumed) != 6)
        return std::nullopt;
    const std::string zone = text.substr(std::size_t(consumed));
    if (zone != "Z" && zone != "+00:00" && zone != "UTC")
        return std::nullopt;
    if (month < 1 || month > 12 || day < 1 || day > 31 || hour > 23 || minute > 59 || second < 0 || second >= 61)
        return std::nullopt;
    std::tm tm{};
    tm.tm_year = year - 1900;
    tm.tm_mon = month - 1;
    tm.tm_mday = day;
    tm.tm_hour = hour;
    tm.tm_min = minute;
    return double(timegm(&tm)) + second;
}

double spearman(const std::vector<double>& x, const std::vector<double>& y)
{
    if (x.size() != y.size() || x.size() < 3)
        return std::nan("");
    const std::vector<double> rx = ranks(x), ry = ranks(y);
    const double n = double(x.size()), mean = (n - 1) / 2;
    double sxy = 0, sxx = 0, syy = 0;
    for (std::size_t i = 0; i < x.size(); ++i) {
        sxy += (rx[i] - mean) * (ry[i] - mean);
        sxx += (rx[i] - mean) * (rx[i] - mean);
        syy += (ry[i] - mean) * (ry[i] - mean);
    }
    return sxx > 0 && syy > 0 ? sxy / std::sqrt(sxx * syy) : std::nan("");
}

std::optional<SweepTimeline> sweepTimeline(const AnalysisResult& result, const SuspectThresholds& thresholds)
{
    SweepTimeline timeline;
    timeline.perBundle = !result.bundles.empty();
    if (!result.prompts.empty())
        timeline.layers = result.prompts.front().layers;
    std::vector<std::int64_t> cells, off;
    if (timeline.perBundle) {
        for (const SweepBundle& b : result.bundles)
            if (b.problem.empty()) {
                TimelinePoint point;
                point.name = b.name;
                point.created = b.created;
                timeline.points.push_back(point);
            }
        cells.assign(timeline.points.size(), 0);
        off.assign(timeline.points.size(), 0);
        for (const PromptAnalysis& p : result.prompts) {
            // A sweep names its prompts "BUNDLE/ID".
            const std::string bundle = p.id.substr(0, p.id.rfind('/'));
            for (std::size_t i = 0; i < timeline.points.size(); ++i)
                if (timeline.points[i].name == bundle)
                    add(timeline.points[i], p, statsOf(p, thresholds), cells[i], off[i]);
        }
    } else {
        for (const PromptAnalysis& p : result.prompts) {
            TimelinePoint point;
            point.name = p.id;
            cells.push_back(0);
            off.push_back(0);
            add(point, p, statsOf(p, thresholds), cells.back(), off.back());
            timeline.points.push_back(point);
        }
    }
    constexpr std::size_t kFewestRequests = 5;
    if (timeline.points.size() < (timeline.perBundle ? 2 : kFewestRequests))
        return std::nullopt;
    for (std::size_t i = 0; i < timeline.points.size(); ++i) {
        timeline.points[i].offFraction = cells[i] ? double(off[i]) / double(cells[i]) : std::nan("");
        timeline.points[i].x = double(i);
    }

    // By time when every bundle recorded one, and no two the same (else the order is all there is).
    std::vector<double> seconds;
    for (const TimelinePoint& point : timeline.points)
        if (const std::optional<double> s = isoSeconds(point.created))
            seconds.push_back(*s);
    std::vector<double> sorted = seconds;
    std::sort(sorted.begin(), sorted.end());
    timeline.byTime = timeline.perBundle && seconds.size() == timeline.points.size() &&
                      std::adjacent_find(sorted.begin(), sorted.end()) == sorted.end();
    if (timeline.byTime)
        for (std::size_t i = 0; i < timeline.points.size(); ++i)
            timeline.points[i].x = seconds[i] - sorted.front();

    std::vector<double> x, y;
    for (const TimelinePoint& point : timeline.points)
        if (std::isfinite(point.worstRatio)) {
            x.push_back(point.x);
            y.push_back(double(point.worstRatio));
        }
    timeline.rankCorrelation = spearman(x, y);
    // A trend worth a sentence: the worst ratio rises with x, over enough points, and some point
    // is off the floor (a rising line of noise is no fault).
    constexpr double kRising = 0.7;
    constexpr std::size_t kFewest = 5;
    const auto firstOff = std::find_if(timeline.points.begin(), timeline.points.end(),
                                       [](const TimelinePoint& point) { return point.offFraction > 0; });
    if (x.size() >= kFewest && timeline.rankCorrelation >= kRising && firstOff != timeline.points.end()) {
        const auto byX = std::minmax_element(timeline.points.begin(), timeline.points.end(),
                                             [](const TimelinePoint& a, const TimelinePoint& b) { return a.x < b.x; });
        const int offPoints = int(std::count_if(timeline.points.begin(), timeline.points.end(),
                                                [](const TimelinePoint& point) { return point.offFraction > 0; }));
        const std::string unit = timeline.perBundle ? "captures" : "requests";
        timeline.trend = "the worst cell rises with " + std::string(timeline.byTime ? "capture time" : timeline.perBundle ? "capture order" : "request index") +
                         " (Spearman " + number(timeline.rankCorrelation) + " over " + std::to_string(x.size()) + " " + unit +
                         "): from " + number(byX.first->worstRatio) + " floors at " + byX.first->name + " to " +
                         number(byX.second->worstRatio) + " at " + byX.second->name + "; off cells in " + std::to_string(offPoints) +
                         " of them, the first " + firstOff->name;
    }
    return timeline;
}

}  // namespace kvscope
