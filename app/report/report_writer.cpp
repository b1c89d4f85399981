#include "report/report_writer.h"

#include "analysis/analysis_json.h"
#include "analysis/heatmap_grid.h"
#include "widgets/heatmap_view.h"
#include "analysis/worst_cells.h"

#include <QDir>
#include <QFile>
#include <QTextStream>

#include <algorithm>
#include <cmath>
#include <sstream>

// Resources compiled into a static library must be registered by hand (outside any namespace).
static void registerReportResources()
{
    Q_INIT_RESOURCE(resources);
}

namespace kvscope {

namespace {

// Reports of large captures stay usable: at most this many columns per map (worst value kept).
constexpr std::int64_t kMaxReportColumns = 1024;

QString html(const std::string& s)
{
    return QString::fromStdString(s).toHtmlEscaped();
}

QString resource(const QString& name)
{
    static const bool registered = (registerReportResources(), true);
    (void)registered;
    QFile f(":/report/" + name);
    if (!f.open(QIODevice::ReadOnly))
        throw std::runtime_error(("missing resource " + name).toStdString());
    return QString::fromUtf8(f.readAll());
}

std::string number(float v)
{
    if (std::isnan(v))
        return "null";
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.4g", double(v));
    return buf;
}

struct MapSpec {
    std::string id;
    std::string title;
    HeatmapGrid grid;
    ScaleKind scale;
    std::vector<std::string> rowLabels, layerNames, tokenText;
    double prefill = std::nan("");
    std::vector<std::int64_t> divergences;
    std::vector<std::pair<std::int64_t, std::string>> topLabels;
    std::string xName = "token", xLabel = "token", metric;
};

std::string scaleName(ScaleKind k)
{
    return k == ScaleKind::Bc ? "bc" : k == ScaleKind::Ratio ? "ratio" : "error";
}

void writeMapJson(std::ostream& o, const MapSpec& m)
{
    const QCPRange range = defaultRange(m.scale);
    o << "{\"id\":" << jsonString(m.id) << ",\"columns\":" << m.grid.columns << ",\"firstToken\":" << m.grid.firstToken
      << ",\"tokensPerColumn\":" << m.grid.tokensPerColumn << ",\"scale\":{\"kind\":\"" << scaleName(m.scale)
      << "\",\"min\":" << range.lower << ",\"max\":" << range.upper << "},\"prefill\":"
      << (std::isnan(m.prefill) ? std::string("null") : number(float(m.prefill))) << ",\"xName\":" << jsonString(m.xName)
      << ",\"xLabel\":" << jsonString(m.xLabel) << ",\"metric\":" << jsonString(m.metric) << ",\"divergences\":[";
    for (std::size_t i = 0; i < m.divergences.size(); ++i)
        o << (i ? "," : "") << m.divergences[i];
    o << "],\"topLabels\":[";
    for (std::size_t i = 0; i < m.topLabels.size(); ++i)
        o << (i ? "," : "") << "[" << m.topLabels[i].first << "," << jsonString(m.topLabels[i].second) << "]";
    o << "]";
    auto strings = [&](const char* key, const std::vector<std::string>& v) {
        o << ",\"" << key << "\":[";
        for (std::size_t i = 0; i < v.size(); ++i)
            o << (i ? "," : "") << jsonString(v[i]);
        o << "]";
    };
    strings("rows", m.rowLabels);
    strings("layerNames", m.layerNames);
    if (!m.tokenText.empty())
        strings("tokenText", m.tokenText);
    o << ",\"values\":[";
    for (std::size_t i = 0; i < m.grid.values.size(); ++i)
        o << (i ? "," : "") << number(m.grid.values[i]);
    o << "],\"heads\":[";
    for (std::size_t i = 0; i < m.grid.heads.size(); ++i)
        o << (i ? "," : "") << m.grid.heads[i];
    o << "]}";
}

void renderPng(const MapSpec& m, const QString& path)
{
    HeatmapView view;
    view.resize(1400, std::max(260, int(m.rowLabels.size()) * 16 + 110));
    view.setGrid(m.grid);
    QStringList rows;
    for (const std::string& r : m.rowLabels)
        rows << QString::fromStdString(r);
    view.resetView(m.grid.firstToken + m.grid.columns * m.grid.tokensPerColumn, m.grid.rows);
    view.replot(QCustomPlot::rpImmediateRefresh);  // lay out first: how many row labels fit depends on it
    view.setRowLabels(rows);
    QVector<double> divergences;
    for (std::int64_t d : m.divergences)
        divergences << double(d);
    view.setMarkers(m.prefill, divergences);
    view.setScale(m.scale, defaultRange(m.scale), false);
    view.setTitle(QString::fromStdString(m.title));
    view.xAxis->setLabel(QString::fromStdString(m.xLabel));
    if (!m.topLabels.empty()) {
        QVector<double> at;
        QStringList labels;
        for (const auto& [g, label] : m.topLabels)
            at << double(g), labels << QString::fromStdString(label);
        view.setTopLabels(at, labels);
    }
    view.replot(QCustomPlot::rpImmediateRefresh);
    if (!view.savePng(path, view.width(), view.height()))
        throw std::runtime_error(("cannot write " + path).toStdString());
}

std::string layerLabel(const KvCacheConfig& cfg, const std::string& layer)
{
    const KvCacheGroup& g = cfg.groups[std::size_t(cfg.groupOf(layer))];
    std::string name = layer;
    if (const auto at = name.find(".self_attn"); at != std::string::npos)
        name.erase(at);
    return name + (g.specType == SpecType::SlidingWindow ? " [sliding]" : g.slidingWindow ? " [full, window]" : " [full]");
}

}  // namespace

ReportFiles writeReport(const BundleReader& reader, const AnalysisResult& result, const Thresholds& thresholds,
                        const QString& directory)
{
    QDir dir(directory);
    if (!dir.exists() && !QDir().mkpath(directory))
        throw std::runtime_error(("cannot create " + directory).toStdString());
    const KvCacheConfig& cfg = reader.config();
    std::vector<MapSpec> maps;

    for (const PromptAnalysis& p : result.prompts) {
        std::vector<std::pair<HeatmapMetric, std::string>> metrics{{HeatmapMetric::RelLinf, "relative L-inf"},
                                                                   {HeatmapMetric::RelL2, "relative L2"}};
        if (p.threeWay) {
            metrics.insert(metrics.begin(), {HeatmapMetric::Bc, "BC"});
            metrics.insert(metrics.begin(), {HeatmapMetric::ErrorRatio, "error ratio"});
        }
        const PromptInfo& info = reader.prompt(p.id);
        for (const auto& [metric, name] : metrics)
            for (KvPart part : {KvPart::K, KvPart::V}) {
                MapSpec m;
                m.id = p.id + "_" + kvPartName(part) + "_" +
                       (metric == HeatmapMetric::Bc ? "bc" : metric == HeatmapMetric::ErrorRatio ? "ratio"
                                                   : metric == HeatmapMetric::RelL2 ? "l2" : "linf");
                HeatmapSpec spec;
                spec.metric = metric;
                spec.part = part;
                const HeatmapGrid full = buildHeatmap(p, spec);
                m.grid = poolColumns(full, 0, full.columns, kMaxReportColumns, lowerIsWorse(metric));
                m.scale = metric == HeatmapMetric::Bc ? ScaleKind::Bc : metric == HeatmapMetric::ErrorRatio ? ScaleKind::Ratio : ScaleKind::Error;
                m.title = p.id + ": " + kvPartName(part) + " " + name + (metric == HeatmapMetric::Bc ? "" : ", max over heads");
                m.metric = std::string(kvPartName(part)) + " " + name;
                for (const std::string& l : p.layers) {
                    m.rowLabels.push_back(layerLabel(cfg, l));
                    m.layerNames.push_back(l);
                }
                m.tokenText = info.tokenStrings;
                m.prefill = double(p.promptLen) - 0.5;
                for (const Divergence& d : p.divergences)
                    m.divergences.push_back(d.position);
                maps.push_back(std::move(m));
            }
    }
    if (result.aggregate) {
        const AggregateBc& a = *result.aggregate;
        for (KvPart part : {KvPart::K, KvPart::V}) {
            MapSpec m;
            m.id = std::string("aggregate_") + kvPartName(part) + "_bc";
            m.grid = poolColumns(aggregateHeatmap(a, part), 0, a.generationCount, kMaxReportColumns, true);
            m.scale = ScaleKind::Bc;
            m.title = std::string("BC by generation index across prompts: ") + kvPartName(part);
            m.metric = std::string(kvPartName(part)) + " BC";
            m.xName = "generation index";
            m.xLabel = "generation index (0 = first decode token); top: divergences c/N";
            for (const std::string& l : a.layers) {
                m.rowLabels.push_back(layerLabel(cfg, l));
                m.layerNames.push_back(l);
            }
            for (std::int64_t g = 0; g < a.generationCount; ++g)
                if (a.divergenceCounts[std::size_t(g)] > 0)
                    m.topLabels.emplace_back(g, std::to_string(a.divergenceCounts[std::size_t(g)]) + "/" + std::to_string(a.promptIds.size()));
            maps.push_back(std::move(m));
        }
    }

    ReportFiles files;
    for (const MapSpec& m : maps) {
        const QString png = QString::fromStdString(m.id) + ".png";
        renderPng(m, dir.filePath(png));
        files.images << dir.filePath(png);
    }

    const std::vector<Violation> violations = checkThresholds(result, thresholds);
    QString body;
    QTextStream out(&body);
    const BundleMetadata& meta = reader.metadata();
    out << "<h1>kvscope report</h1><div>" << html(reader.path()) << "</div>";
    out << "<h2>Capture</h2><table>";
    out << "<tr><th>model</th><td>" << html(meta.model) << "</td></tr><tr><th>engine</th><td>" << html(meta.engine)
        << "</td></tr><tr><th>created</th><td>" << html(meta.created) << "</td></tr>";
    if (!meta.notes.empty())
        out << "<tr><th>notes</th><td>" << html(meta.notes) << "</td></tr>";
    for (const auto& [key, value] : meta.extra)
        out << "<tr><th>" << html(key) << "</th><td><code>" << html(value) << "</code></td></tr>";
    out << "<tr><th>tensor parallel</th><td>TP " << cfg.tpSize << ", " << cfg.totalNumKvHeads << " KV heads, "
        << (cfg.tpMode() == TpMode::Partitioned ? "partitioned" : "replicated") << " (" << cfg.headsPerRank()
        << " per rank)</td></tr><tr><th>KV cache</th><td>" << cfg.numBlocks << " blocks<br>";
    for (std::size_t g = 0; g < cfg.groups.size(); ++g) {
        const KvCacheGroup& group = cfg.groups[g];
        out << "group " << g << ": " << html(specTypeName(group.specType))
            << (group.slidingWindow ? QString(" (sliding_window %1)").arg(*group.slidingWindow) : QString()) << ", block_size "
            << group.blockSize << ", " << html(dtypeName(group.dtype)) << ", " << group.layerNames.size() << " layers, head_size "
            << group.headSize << "<br>";
    }
    out << "</td></tr></table>";

    out << "<h2>Verdict</h2><p>Thresholds: combined BC per layer &ge; " << thresholds.minBc
        << "; L-inf multiplier per layer (largest actual L-inf / largest expected L-inf) &le; " << thresholds.maxRatio;
    if (thresholds.maxLinf)
        out << "; relative L-inf &le; " << *thresholds.maxLinf;
    out << ". Result: " << (violations.empty() ? "<span class=pass>PASS</span>" : "<span class=fail>FAIL</span>") << "</p>";
    const bool twoWay = std::any_of(result.prompts.begin(), result.prompts.end(), [](const PromptAnalysis& p) { return !p.threeWay; });
    if (twoWay && !thresholds.maxLinf)
        out << "<p class=fail>Two-way prompts (no fp32 baseline) have no dtype-noise reference: they are not judged "
               "unless a maximum relative L-inf is given (kvscope check --max-linf).</p>";
    if (!violations.empty()) {
        out << "<table><tr><th>prompt</th><th>layer</th><th>token</th><th>head</th><th>metric</th><th>value</th><th>threshold</th></tr>";
        for (const Violation& v : violations)
            out << "<tr><td>" << (v.prompt.empty() ? QString("all") : html(v.prompt)) << "</td><td>" << html(v.layer) << "</td><td>"
                << (v.token >= 0 ? QString::number(v.token) : QString("-")) << "</td><td>"
                << (v.head >= 0 ? QString::number(v.head) : QString("-")) << "</td><td>" << html(v.metric) << "</td><td>"
                << QString::number(v.value, 'g', 4) << "</td><td>" << v.threshold << "</td></tr>";
        out << "</table>";
    }
    for (const std::string& problem : result.problems)
        out << "<p class=fail>" << html(problem) << "</p>";

    auto mapBlock = [&](const MapSpec& m) {
        out << "<div class=map><div class=maptitle>" << html(m.title) << "</div><div id=\"map-" << html(m.id)
            << "\"></div><div class=maphint>hover for values; drag to zoom, double-click to reset; image: <a href=\""
            << html(m.id) << ".png\">" << html(m.id) << ".png</a></div></div>";
    };
    out << "<p class=legend>Red line: prefill | decode. Orange dashed: divergences. Hatched: no data (outside a freed "
           "sliding window, never written). Errors 0..0.2 (yellow to red), error ratio 0..3 (green: like dtype noise, "
           "red: far worse), BC 0..1 (below 0.8 flat red).</p>";
    for (const PromptAnalysis& p : result.prompts) {
        out << "<h2>Prompt " << html(p.id) << "</h2><p>" << (p.threeWay ? "three-way" : "two-way") << ", prompt_len "
            << p.promptLen << ", " << p.tokens << " positions, divergences: ";
        if (p.divergences.empty())
            out << "none";
        for (const Divergence& d : p.divergences) {
            out << d.position;
            if (d.inBounds)
                out << (*d.inBounds ? " (within the bf16 ulp bound)" : " (beyond the bf16 ulp bound)");
            out << " ";
        }
        out << "</p>";
        for (const MapSpec& m : maps)
            if (m.id.rfind(p.id + "_", 0) == 0)
                mapBlock(m);
        out << "<h3>Worst cells</h3><table><tr><th>layer</th><th>token</th><th>K/V</th><th>head</th><th>rel. L-inf</th>"
            << (p.threeWay ? "<th>expected (base)</th><th>ratio</th>" : "") << "</tr>";
        for (const WorstCell& c : worstCells(p, 15)) {
            out << "<tr><td>" << html(p.layers[std::size_t(c.layer)]) << "</td><td>" << c.token << "</td><td>"
                << kvPartName(c.part) << "</td><td>" << c.head << "</td><td>" << QString::number(c.error, 'g', 4) << "</td>";
            if (p.threeWay)
                out << "<td>" << QString::number(c.baseError, 'g', 4) << "</td><td>" << QString::number(c.ratio, 'g', 4) << "</td>";
            out << "</tr>";
        }
        out << "</table>";
        for (const std::string& issue : p.issues)
            out << "<p class=fail>" << html(issue) << "</p>";
    }
    if (result.aggregate) {
        const AggregateBc& a = *result.aggregate;
        out << "<h2>Across prompts</h2><p>" << a.promptIds.size() << " three-way prompt(s), " << a.generationCount
            << " generation indices.</p>";
        for (const MapSpec& m : maps)
            if (m.id.rfind("aggregate_", 0) == 0)
                mapBlock(m);
        out << "<h3>Combined BC per layer</h3><table><tr><th>layer</th><th>K</th><th>V</th></tr>";
        for (std::size_t l = 0; l < a.layers.size(); ++l) {
            out << "<tr><td>" << html(a.layers[l]) << "</td>";
            for (int part = 0; part < 2; ++part) {
                const float bc = a.combined[std::size_t(part)][l];
                out << "<td class=" << (bc < thresholds.minBc ? "fail" : "pass") << ">"
                    << (std::isnan(bc) ? QString("no data") : QString::number(bc, 'f', 4)) << "</td>";
            }
            out << "</tr>";
        }
        out << "</table>";
    }

    std::ostringstream json;
    json << "{\"maps\":[";
    for (std::size_t i = 0; i < maps.size(); ++i) {
        if (i)
            json << ",";
        writeMapJson(json, maps[i]);
    }
    json << "]}";
    // Inside <script>, "</" could end the element: escape it.
    const QString data = QString::fromStdString(json.str()).replace("</", "<\\/");

    const QString page = "<!DOCTYPE html><html><head><meta charset=\"utf-8\"><title>kvscope report</title><style>" +
                         resource("report.css") + "</style></head><body>" + body +
                         "<div id=tooltip></div><script type=\"application/json\" id=\"kvscope-data\">" + data +
                         "</script><script>" + resource("report.js") + "</script></body></html>\n";
    files.html = dir.filePath("report.html");
    QFile file(files.html);
    if (!file.open(QIODevice::WriteOnly) || file.write(page.toUtf8()) < 0)
        throw std::runtime_error(("cannot write " + files.html).toStdString());
    files.htmlBytes = file.size();
    return files;
}

}  // namespace kvscope
