#include "report/report_writer.h"

#include "analysis/off_floor.h"
#include "analysis/source_summary.h"
#include "analysis/sweep_timeline.h"

#include "analysis/heatmap_grid.h"
#include "analysis/impact_summary.h"
#include "analysis/impact_view_text.h"
#include "analysis/map_spec.h"
#include "analysis/state_rows.h"
#include "analysis/suspect.h"
#include "widgets/heatmap_view.h"
#include "widgets/timeline_view.h"
#include "analysis/worst_cells.h"
#include "diff/diff_maps.h"
#include "quant/impact_recipe.h"
#include "util/json_writer.h"
#include "util/version.h"

#include <QDir>
#include <QFile>
#include <QTextStream>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
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

// The maps' values to the four significant digits the tooltips show (a smaller page; the
// JSON of the analysis has them whole).
float fourDigits(float v)
{
    if (!std::isfinite(v))
        return v;
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.4g", double(v));
    return std::strtof(buf, nullptr);
}

// One map of the report: its labelling (shared with the app) and its pooled grid.
struct ReportMap {
    std::string id;
    MapSpec spec;
    HeatmapGrid grid;
    std::vector<double> offThresholds;  // a map in floors: [row], in units of which it is coloured
};

void writeMapJson(JsonWriter& w, const ReportMap& m)
{
    const MapSpec& s = m.spec;
    w.beginObject()
        .field("id", m.id)
        .field("title", s.title)
        .field("columns", m.grid.columns)
        .field("firstToken", m.grid.firstToken)
        .field("tokensPerColumn", m.grid.tokensPerColumn)
        .key("scale")
        .beginObject()
        .field("kind", scaleName(s.scale))
        .field("min", s.range.lower)
        .field("max", s.range.upper)
        .endObject()
        .field("prefill", s.prefillBoundary)  // NaN (no decode): null
        .field("xName", s.xName)
        .field("xLabel", s.xLabel)
        .field("metric", s.metricLabel)
        .key("divergences")
        .numbers(s.divergences)
        .key("topLabels")
        .array(s.topLabels.size(), [&](std::size_t i) {
            w.beginArray().value(s.topLabels[i].first).value(s.topLabels[i].second).endArray();
        })
        .key("rows")
        .strings(s.rowLabels)
        .key("layerNames")
        .strings(s.layerNames);
    if (!s.tokenText.empty())
        w.key("tokenText").strings(s.tokenText);
    if (s.onsetRow >= 0)
        w.field("onsetRow", s.onsetRow).key("spreadRows").numbers(s.spreadRows).field("spreadLabel", s.spreadLabel);
    if (!m.offThresholds.empty())
        w.key("offThresholds").array(m.offThresholds.size(), [&](std::size_t i) { w.value(m.offThresholds[i]); });
    const auto words = legendWords(s.scale);  // the colour bar's words, at their values
    w.key("legend").array(words.size(), [&](std::size_t i) { w.beginArray().value(words[i].first).value(words[i].second).endArray(); });
    w.key("values").array(m.grid.values.size(), [&](std::size_t i) { w.value(fourDigits(m.grid.values[i])); });
    w.key("heads").numbers(m.grid.heads).endObject();
}

// The colour stops of every scale, for the report's script (the same as the app's).
void writeScalesJson(JsonWriter& w)
{
    const auto rgb = [&](Rgb c) { w.beginArray().value(c.r).value(c.g).value(c.b).endArray(); };
    w.beginObject();
    for (ScaleKind kind : {ScaleKind::Error, ScaleKind::Ratio, ScaleKind::Bc, ScaleKind::Change}) {
        const std::vector<ColorStop>& stops = colorStops(kind);
        w.key(scaleName(kind)).array(stops.size(), [&](std::size_t i) {
            w.beginArray().value(stops[i].at);
            rgb(stops[i].color);
            w.endArray();
        });
    }
    w.key("prefillLine");
    rgb(kPrefillLineColor);
    w.key("divergenceLine");
    rgb(kDivergenceLineColor);
    w.key("markerOutline");
    rgb(kMarkerOutlineColor);
    w.endObject();
}

void renderPng(const ReportMap& m, const QString& path)
{
    HeatmapView view;
    view.resize(1400, std::max(260, int(m.spec.rowLabels.size()) * 16 + 110));
    HeatmapGrid coloured = m.grid;  // (the JSON keeps the floors, which the tooltips say)
    if (!m.offThresholds.empty())
        divideRows(coloured, m.offThresholds);
    view.setGrid(coloured);
    view.resetView(m.grid.firstToken + m.grid.columns * m.grid.tokensPerColumn, m.grid.rows);
    view.replot(QCustomPlot::rpImmediateRefresh);  // lay out first: how many row labels fit depends on it
    view.showMap(m.spec);
    view.replot(QCustomPlot::rpImmediateRefresh);
    if (!view.savePng(path, view.width(), view.height()))
        throw std::runtime_error(("cannot write " + path).toStdString());
}

// A prompt's name as part of a map's file name and HTML id: a sweep's "BUNDLE/ID" without the
// slash, which would make a folder of it.
std::string mapName(const std::string& promptId)
{
    std::string name = promptId;
    for (std::size_t at = name.find('/'); at != std::string::npos; at = name.find('/', at))
        name.replace(at, 1, "--");
    return name;
}

// Every map of the report: per prompt its metrics for K and V, and the across-prompt BCs.
std::vector<ReportMap> reportMaps(const CaptureLoader& loader, const AnalysisResult& result, const DiffResult* against,
                                  const SuspectThresholds& suspects)
{
    const KvCacheConfig& cfg = loader.config();
    std::vector<ReportMap> maps;
    if (against)  // per matched prompt: B - A, then A's and B's ratios, K and V
        for (std::size_t m = 0; m < against->maps.size(); ++m) {
            const std::string& id = against->maps[m].b;
            const auto prompt = std::find_if(result.prompts.begin(), result.prompts.end(),
                                             [&](const PromptAnalysis& p) { return p.id == id; });
            for (const auto& [kind, key] : {std::pair{DiffMapKind::Change, "change"}, std::pair{DiffMapKind::A, "a"},
                                            std::pair{DiffMapKind::B, "b"}})
                for (KvPart part : {KvPart::K, KvPart::V}) {
                    const HeatmapGrid full = diffHeatmap(*against, m, part, kind);
                    maps.push_back({"against_" + mapName(id) + "_" + against->partNames[std::size_t(part)] + "_" + key,
                                    diffMapSpec(cfg, *against, m, part, kind, *prompt, loader.prompt(id)),
                                    poolColumns(full, 0, full.columns, kMaxReportColumns, false), {}});
                }
        }

    for (const PromptAnalysis& p : result.prompts) {
        std::vector<std::pair<HeatmapMetric, const char*>> metrics{{HeatmapMetric::RelLinf, "linf"}, {HeatmapMetric::RelL2, "l2"}};
        if (p.threeWay) {
            metrics.insert(metrics.begin(), {HeatmapMetric::Bc, "bc"});
            if (tokenBcMeaningful(p))  // (as the app: too few values a token and it means nothing)
                metrics.insert(metrics.begin(), {HeatmapMetric::BcVsNoise, "bc_vs_noise"});
        }
        metrics.insert(metrics.begin(), {HeatmapMetric::ErrorRatio, "ratio"});  // in floors, both ways
        const PromptInfo& info = loader.prompt(p.id);
        for (const auto& [metric, key] : metrics)
            for (KvPart part : {KvPart::K, KvPart::V}) {
                HeatmapSpec spec;
                spec.metric = metric;
                spec.part = part;
                const HeatmapGrid full = buildHeatmap(p, spec);
                MapSpec shown = promptMapSpec(cfg, p, info, spec);
                shown.range = dataRange(p, spec, false);
                maps.push_back({mapName(p.id) + "_" + partName(p, part) + "_" + key, std::move(shown),
                                poolColumns(full, 0, full.columns, kMaxReportColumns, lowerIsWorse(metric)),
                                metric == HeatmapMetric::ErrorRatio ? finalMapOffThresholds(p, suspects) : std::vector<double>()});
            }
    }
    if (result.aggregate) {
        const AggregateBc& a = *result.aggregate;
        for (const bool vsNoise : {true, false})
            for (KvPart part : {KvPart::K, KvPart::V})
                maps.push_back({std::string("aggregate_") + partLabel(cfg.firstCompared(), part) + (vsNoise ? "_bc_vs_noise" : "_bc"),
                                acrossPromptsMapSpec(cfg, result, part, vsNoise),
                                poolColumns(aggregateHeatmap(result, part, vsNoise), 0, a.generationCount, kMaxReportColumns, true), {}});
    }

    return maps;
}

void writeMapBlock(QTextStream& out, const ReportMap& m)
{
    out << "<div class=map><div class=maptitle>" << html(m.spec.title) << "</div><div id=\"map-" << html(m.id)
        << "\"></div><div class=maphint>hover for values; drag to zoom, double-click to reset; image: <a href=\""
        << html(m.id) << ".png\">" << html(m.id) << ".png</a></div></div>";
}

// The maps whose id starts with `prefix`.
void writeMapBlocks(QTextStream& out, const std::vector<ReportMap>& maps, const std::string& prefix)
{
    for (const ReportMap& m : maps)
        if (m.id.rfind(prefix, 0) == 0)
            writeMapBlock(out, m);
}

// The report opens with where the bug is and what kind it is (docs/suspects.md).
void writeSuspectTable(QTextStream& out, const std::vector<Suspect>& suspects, const AnalysisResult& result)
{
    {
        out << "<table><tr><th>pattern</th><th>explanation (residual, floors)</th><th>score</th><th>first layer</th>"
               "<th>tokens</th><th>heads</th><th>TP ranks</th><th>prompts</th><th>evidence</th></tr>";
        for (const Suspect& s : suspects) {
            QStringList heads, ranks, prompts;
            for (const std::string& id : s.prompts)
                prompts << QString::fromStdString(id);
            for (int h : s.heads)
                heads << QString::number(h);
            for (int r : s.tpRanks)
                ranks << QString::number(r);
            QStringList dcp;
            for (int d : s.dcpRanks)
                dcp << QString::number(d);
            if (!dcp.isEmpty())  // decode context parallelism: whose share of the positions
                ranks.last() += QString(" (DCP rank %1)").arg(dcp.join(", "));
            // The hypothesis that explains it, or for `unexplained` the nearest one tried.
            const QString explanation =
                s.hypothesis.kind.empty() || s.pattern == SuspectPattern::NonFinite  // (its kind is its pattern)
                    ? QStringLiteral("-")
                    : QString("%1%2 (%3)")
                          .arg(s.pattern == SuspectPattern::Unexplained ? "nearest: " : "",
                               html(s.hypothesis.kind), QString::number(s.hypothesis.residualFloors, 'g', 3));
            out << "<tr class=fail><td>" << suspectPatternName(s.pattern) << "</td><td>" << explanation << "</td><td>"
                << (s.pattern == SuspectPattern::NonFinite ? QStringLiteral("NaN / inf") : QString::number(s.score, 'g', 3))
                << "</td><td>" << html(s.firstLayer) << "</td><td>" << s.firstToken << "-" << s.lastToken << " ("
                << html(s.phase) << ", " << html(result.prompts.empty() ? s.kv : partsNamed(result.prompts.front(), s.kv))
                << (s.prompts.size() > 1 ? QString(", over %1 prompts").arg(s.prompts.size()) : QString()) << ")</td><td>"
                << heads.join(", ") << "</td><td>" << ranks.join(", ") << "</td><td>" << prompts.join(", ").toHtmlEscaped()
                << "</td><td>" << (s.prompts.size() > 1 ? html("In " + s.evidencePrompt + ": ") : QString())
                << html(s.evidence)
                << (s.impact ? "<div class=impact>Output: " + html(s.impact->text) + "</div>" : QString()) << "</td></tr>";
        }
        out << "</table>";
    }
}

void writeSuspects(QTextStream& out, const AnalysisResult& result)
{
    out << "<h2>Suspects</h2>";
    if (result.suspects.empty())
        out << "<p>None: nothing leaves the noise floor of its dtype.</p>";
    else
        writeSuspectTable(out, result.suspects, result);
}

QString floorsText(double x)
{
    return std::isfinite(x) ? QString::number(x, 'g', x < 10 ? 2 : 3) : QStringLiteral("no data");
}

// kvscope report --against: the comparison with A first (docs/diff.md), with its maps.
void writeComparison(QTextStream& out, const DiffResult& d, const AnalysisResult& result, const std::vector<ReportMap>& maps)
{
    const int worse = d.count(Change::Worse), better = d.count(Change::Better);
    out << "<h2>Against A</h2><div>A: " << html(d.pathA) << (d.aFromAnalysisJson ? " (analysis)" : "") << "</div><p>"
        << d.matched.size() << " prompt(s) matched by their tokens, "
        << (d.referenceFromA ? "A's reference (B is an engine-only capture)" : "the same reference (fingerprints)") << ". Per layer the "
        << diffStatName(d.options.stat) << " of the cells' error ratio in floors; worse: above what noise reaches and more than "
        << d.options.maxWorse << "x A's. Result: <span class=" << (worse ? "fail>B is worse in " + QString::number(worse) + " layer(s)"
                                                                   : better ? "pass>B is no worse, and better in " + QString::number(better) + " layer(s)"
                                                                            : "pass>B is no worse")
        << "</span></p>";
    if (!d.onlyA.empty() || !d.onlyB.empty())
        out << "<p>Not matched (left out): " << d.onlyA.size() << " prompt(s) of A, " << d.onlyB.size() << " of B.</p>";
    if (worse) {
        out << "<h3>Regressions</h3><table><tr><th>layer</th><th>part</th><th>A</th><th>B</th><th>B / A</th><th>cells worse</th></tr>";
        for (const LayerDiff& l : d.layers)
            for (std::size_t p = 0; p < 2; ++p)
                if (l.change[p] == Change::Worse)
                    out << "<tr class=fail><td>" << html(l.name) << "</td><td>" << html(d.partNames[p]) << "</td><td>"
                        << floorsText(l.statA[p]) << "</td><td>" << floorsText(l.statB[p]) << "</td><td>"
                        << floorsText(l.statB[p] / l.statA[p]) << "</td><td>" << l.worseCells[p] << " of " << l.cells[p] << "</td></tr>";
        out << "</table>";
        if (d.firstWorse) {
            const CellMove& c = *d.firstWorse;
            out << "<p>First worse: " << html(d.layerNamesB[std::size_t(c.layer)]);
            if (c.token >= 0)
                out << ", token " << c.token << " of prompt " << html(c.prompt) << " (" << html(d.partNames[std::size_t(c.part)])
                    << ": " << floorsText(c.a) << " &rarr; " << floorsText(c.b) << " floors)";
            out << "</p>";
        }
        out << "<h3>Suspects of the change</h3>";
        if (d.suspects.empty())
            out << "<p>None: no cell got worse beyond noise (the statistic moved broadly).</p>";
        else
            writeSuspectTable(out, d.suspects, result);
    }
    writeMapBlocks(out, maps, "against_");
}

// What-if by output, where the bundle measured it: the recipe for vLLM and the layers it keeps.
void writeWhatIfByOutput(QTextStream& out, const WhatIfResult& r, const std::vector<PromptAnalysis>& prompts)
{
    std::vector<const ImpactRecord*> records;
    for (const PromptAnalysis& p : prompts)
        if (p.impact)
            records.push_back(&*p.impact);
    const std::optional<ImpactRecipe> found = recipeForMeasured(records, r.layers);
    if (!found)
        return;
    const ImpactRecipe& recipe = *found;
    out << "<h3>By output</h3><p>The bundle measured each scheme's impact: the reference model's next-token KL with "
           "one layer's KV quantised, against what bf16 noise does in that layer (docs/whatif.md). Recipe: ";
    if (recipe.arguments.empty())
        out << html(recipe.text);
    else  // (the text starts with the arguments)
        out << "<code>" << html(recipe.arguments) << "</code>" << html(recipe.text.substr(recipe.arguments.size()));
    out << "</p><table class=whatif><tr><th>scheme</th><th>layer kept in bf16</th>"
        << "<th>KL median / max</th><th>its noise</th></tr>";
    for (const SchemeImpact& s : recipe.schemes)
        for (const SchemeLayerImpact& l : s.layers)
            if (!l.within)
                out << "<tr><td>" << html(s.scheme.name()) << "</td><td>" << html(l.layer) << "</td><td>"
                    << html(klText(l.kl.klMedian) + " / " + klText(l.kl.klMax)) << "</td><td>"
                    << html(l.noise ? klText(l.noise->klMedian) + " / " + klText(l.noise->klMax) : std::string("-"))
                    << "</td></tr>";
    out << "</table>";
}

// The what-if: a verdict per scheme, and the layer x scheme table of median errors in floors.
void writeWhatIf(QTextStream& out, const WhatIfResult& r, const std::vector<PromptAnalysis>& prompts)
{
    out << "<h2>What if the cache were quantised?</h2><p>The reference KV (expected) quantised with each scheme: the "
           "median relative L2 error it adds per layer, in bf16 noise floors of the same cells ("
        << (r.floor == "baseline" ? "expected against the fp32 baseline" : "bf16 rounding of the values")
        << "; typical relative L2 K " << QString::number(100 * r.bf16FloorMedian[0], 'g', 3) << "%, V "
        << QString::number(100 * r.bf16FloorMedian[1], 'g', 3) << "%). See docs/whatif.md.</p><ul>";
    for (const WhatIfScheme& s : r.schemes)
        out << "<li><b>" << html(s.scheme.name()) << "</b>: " << html(s.verdict) << "</li>";
    out << "</ul><table class=whatif><tr><th>layer</th>";
    for (const WhatIfScheme& s : r.schemes)
        out << "<th>" << html(s.scheme.name()) << "</th>";
    out << "</tr>";
    for (std::size_t l = 0; l < r.layers.size(); ++l) {
        out << "<tr><td>" << html(r.layers[l]) << "</td>";
        for (const WhatIfScheme& s : r.schemes) {
            const WhatIfLayer& x = s.layers[l];
            out << "<td style=\"background:" << whatIfColour(whatIfCellLevel(x)).name() << "\" title=\"K "
                << QString::number(100 * x.relL2Median[0], 'g', 3) << "%, V " << QString::number(100 * x.relL2Median[1], 'g', 3)
                << "% relative L2; worst head " << QString::number(100 * std::max(x.worstHeadRelL2[0], x.worstHeadRelL2[1]), 'g', 3)
                << "%\">" << html(whatIfCellText(x).toStdString()) << "</td>";
        }
        out << "</tr>";
    }
    out << "</table><p class=legend>Each cell: K / V median error in bf16 noise floors, then after p90 the 90th "
           "percentile of the worse part, which colours the cell (hover: relative L2). Green: within 2 floors; red: 10 "
           "and beyond. hurt: a head of the layer does more than twice as badly as the model's typical worst head.</p>";
    writeWhatIfByOutput(out, r, prompts);
}

void writeCapture(QTextStream& out, const CaptureLoader& loader)
{
    const KvCacheConfig& cfg = loader.config();
    const BundleMetadata& meta = loader.metadata();
    out << "<h2>Capture</h2><table>";
    out << "<tr><th>model</th><td>" << html(meta.model) << "</td></tr><tr><th>engine</th><td>" << html(meta.engine)
        << "</td></tr><tr><th>created</th><td>" << html(meta.created) << "</td></tr>";
    if (!meta.notes.empty())
        out << "<tr><th>notes</th><td>" << html(meta.notes) << "</td></tr>";
    if (!meta.writer.empty())
        out << "<tr><th>written by</th><td>" << html(meta.writer) << "</td></tr>";
    for (const auto& [key, value] : meta.extra)
        out << "<tr><th>" << html(key) << "</th><td><code>" << html(value) << "</code></td></tr>";
    out << "<tr><th>tensor parallel</th><td>TP " << cfg.tpSize << ", ";
    if (cfg.isMla() && cfg.dcpSize == 1)
        out << "the MLA latent on every rank (rank 0's copy analysed, the others compared with it)";
    else if (cfg.isMla())
        out << "the MLA latent on every rank";
    else {
        // Groups that differ in head count are each named, the first compared one first.
        std::size_t first = 0;
        bool differ = false;
        for (std::size_t g = 0; g < cfg.groups.size(); ++g) {
            if (&cfg.groups[g] == &cfg.firstCompared())
                first = g;
            differ = differ || (cfg.groups[g].specType != SpecType::NotCompared &&
                                cfg.groups[g].totalKvHeads != cfg.firstCompared().totalKvHeads);
        }
        out << (differ ? "group " + QString::number(first) + ": " : QString()) << html(describeHeads(cfg.layout(cfg.firstCompared())));
    }
    for (std::size_t g = 0; g < cfg.groups.size(); ++g)  // groups that differ in head count
        if (cfg.groups[g].specType != SpecType::NotCompared && cfg.groups[g].totalKvHeads != cfg.firstCompared().totalKvHeads)
            out << "<br>group " << g << ": " << html(describeHeads(cfg.layout(cfg.groups[g])));
    if (cfg.dcpSize > 1)
        out << "<br>" << html(describeContextParallel(cfg));
    out << "</td></tr><tr><th>KV cache</th><td>" << cfg.numBlocks << " blocks<br>";
    for (std::size_t g = 0; g < cfg.groups.size(); ++g) {
        out << "group " << g << ": " << html(describeGroup(cfg.groups[g])) << "<br>";
    }
    out << "</td></tr></table>";

}

void writeVerdict(QTextStream& out, const AnalysisResult& result, const Thresholds& thresholds)
{
    const std::vector<Violation> violations = checkThresholds(result, thresholds);
    out << "<h2>Verdict</h2><p>Thresholds: combined BC per layer ("
        << (thresholds.bcVsNoise ? "against the noise floor" : "the reference tool's") << ") &ge; " << thresholds.minBc
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
                << (v.head >= 0 ? QString::number(v.head) : QString("-")) << "</td><td>" << html(v.metric)
                << (v.detail.empty() ? QString() : "<br><small>" + html(v.detail) + "</small>") << "</td><td>"
                << QString::number(v.value, 'g', 4) << "</td><td>" << v.threshold << "</td></tr>";
        out << "</table>";
    }
    for (const std::string& problem : result.problems)
        out << "<p class=fail>" << html(problem) << "</p>";
    for (const std::string& line : describeNotCompared(result.notCompared))
        out << "<p>Not compared: " << html(line) << "</p>";
}

// Where the capture recorded each position's source: per source its off cells and worst cell
// (analysis/source_summary.h, as kvscope analyze lists them).
void writeSources(QTextStream& out, const PromptAnalysis& p, const SuspectThresholds& thresholds)
{
    const std::vector<SourceSummary> sources = summarizeBySource(p, p.provenance, finalMapOffThresholds(p, thresholds));
    out << "<h3>By source</h3><p class=legend>Where each position's KV came from, as the capture recorded it; cells off "
           "the noise floor as the map paints them.</p><table><tr><th>source</th><th>positions</th><th>off cells</th>"
           "<th>worst (floors)</th><th>where</th></tr>";
    for (const SourceSummary& s : sources) {
        out << "<tr><td>" << html(s.source) << "</td><td>" << html(spanText(s.spans)) << "</td><td"
            << (s.offCells ? " class=fail" : "") << ">" << s.offCells << " of " << s.cells << "</td><td>"
            << (s.worstLayer < 0 ? QString("-") : QString::number(s.worstRatio, 'g', 4)) << "</td><td>"
            << (s.worstLayer < 0 ? QString("-")
                                 : html(p.layers[std::size_t(s.worstLayer)] + " token " + std::to_string(s.worstToken) + " " +
                                        partName(p, s.worstPart)))
            << "</td></tr>";
    }
    out << "</table>";
}

// A soak run over time (analysis/sweep_timeline.h): the trend, the line as a picture drawn by the
// app's own widget, and every point.
void writeOverTime(QTextStream& out, const SweepTimeline& t, const QString& picture)
{
    out << "<h2>Over time</h2><p>" << (t.trend.empty() ? QString("No rising trend of the worst cell.") : html(t.trend))
        << "</p><img src='" << picture << "' alt='worst cell over time'><table><tr><th>"
        << (t.perBundle ? "capture" : "request") << "</th>" << (t.byTime ? "<th>captured</th><th>seconds</th>" : "")
        << "<th>prompts</th><th>worst (floors)</th><th>off cells</th><th>with a suspect</th></tr>";
    for (const TimelinePoint& point : t.points)
        out << "<tr><td>" << html(point.name) << "</td>"
            << (t.byTime ? "<td>" + html(point.created) + "</td><td>" + QString::number(point.x, 'g', 6) + "</td>" : QString())
            << "<td>" << point.prompts << "</td><td>" << QString::number(point.worstRatio, 'g', 4) << "</td><td"
            << (point.offFraction > 0 ? " class=fail" : "") << ">" << QString::number(100 * point.offFraction, 'f', 2)
            << "%</td><td>" << point.suspects << "</td></tr>";
    out << "</table>";
}

// A hybrid model's state-space layers: per layer its checkpoints, and each checkpoint's worst
// cell against the off threshold, with what the app's hover says of the worst one.
void writeStates(QTextStream& out, const PromptAnalysis& p)
{
    out << "<h3>Recurrent state</h3><p class=legend>Each state-space layer's state at its checkpoints (the state after "
           "positions [0, p)), in the model's order: the worst cell (an SSM head, a run of conv channels) in floors, "
        << (p.threeWay ? "over what bf16 alone does there" : "over the model dtype's rounding")
        << " (docs/suspects.md, \"Recurrent state\").</p><table><tr><th>layer</th><th>checkpoints</th><th>worst, floors</th>"
           "<th>off above</th><th>at its worst checkpoint</th></tr>";
    for (const StateLayerAnalysis& a : p.states) {
        out << "<tr><td>" << html(a.layer) << "</td>";
        if (!a.problem.empty()) {
            out << "<td colspan=4 class=fail>not compared: " << html(a.problem) << "</td></tr>";
            continue;
        }
        std::size_t worstAt = 0;
        float worst = -1;
        for (std::size_t c = 0; c < a.positions.size(); ++c)
            if (const float r = a.worstRatio(c); std::isfinite(r) && r > worst) {
                worst = r;
                worstAt = c;
            }
        out << "<td>" << a.positions.size() << " (" << a.positions.front() << "-" << a.positions.back() << ")</td><td"
            << (worst > a.offThreshold ? " class=fail" : "") << ">" << QString::number(worst, 'g', 4) << "</td><td>"
            << QString::number(a.offThreshold, 'g', 3) << "</td><td>" << html(stateCellText(a, worstAt)) << "</td></tr>";
    }
    out << "</table>";
}

// What each layer's KV does to the reference's next token in this prompt (its impact record;
// nothing without one), the same figures the app's column beside the map shows.
void writeImpact(QTextStream& out, const PromptAnalysis& p, const std::vector<PromptAnalysis>& prompts)
{
    if (!p.impact)
        return;
    const auto kl = [](const std::optional<ImpactFigures>& f) { return f ? html(klText(f->klMax)) : QStringLiteral("-"); };
    out << "<h3>Impact on the output, per layer</h3><p class=legend>The reference model decodes the teacher tokens "
           "reading the engine's KV in one layer (alone) or in it and every later attention layer (from it on); KL of "
           "its next-token distribution against its own, the largest over the "
        << p.impact->steps
        << " decode steps, in nats. Noise: the same with the baseline's (fp32) KV, what bf16 rounding alone does. "
           "Beyond "
        << kImpactNoiseFactor
        << "x the noise (a clean engine's bound, docs/synth.md) in red.</p>";
    // This prompt's own suspects, as `kvscope analyze` and the app's suspect row say them.
    for (const Suspect& s : p.suspects)
        if (s.impact)
            out << "<p class=impactline>" << suspectPatternName(s.pattern) << " suspect from " << html(s.firstLayer)
                << ": <span class=impact>" << html(s.impact->text) << "</span></p>";
    out << "<table><tr><th>layer</th><th>KL max, alone</th>"
           "<th>its noise</th><th>ratio</th><th>top-1 changed, alone</th><th>KL max, from it on</th><th>its noise</th></tr>";
    for (const LayerImpact& l : layerImpacts(prompts, {p.id}, p.layers)) {
        if (!l.alone && !l.from)
            continue;
        out << "<tr><td>" << html(l.layer) << "</td><td>" << kl(l.alone) << "</td><td>" << kl(l.aloneNoise) << "</td><td"
            << (impactLevel(l) == ImpactLevel::AboveNoise ? " class=fail" : "") << ">"
            << html(noiseRatioText(l.alone, l.aloneNoise)) << "</td><td>"
            << (l.alone ? QString("%1 of %2").arg(l.alone->top1Changed).arg(l.alone->steps) : QStringLiteral("-"))
            << "</td><td>" << kl(l.from) << "</td><td>" << kl(l.fromNoise) << "</td></tr>";
    }
    out << "</table>";
}

void writePrompt(QTextStream& out, const PromptAnalysis& p, const std::vector<PromptAnalysis>& prompts,
                 const std::vector<ReportMap>& maps, const SuspectThresholds& thresholds)
{
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
    writeMapBlocks(out, maps, mapName(p.id) + "_");
    const bool heads = p.heads > 1;  // an MLA latent is one vector: no head to name
    out << "<h3>Worst cells</h3><table><tr><th>layer</th><th>token</th><th>" << html(partTitle(p, KvPart::K) + "/" + partTitle(p, KvPart::V))
        << "</th>" << (heads ? "<th>head</th>" : "") << "<th>floors</th><th>" << html(worstCellStatistic(p))
        << "</th><th>noise floor</th></tr>";
    for (const WorstCell& c : worstCells(p, 15)) {
        out << "<tr><td>" << html(p.layers[std::size_t(c.layer)]) << "</td><td>" << c.token << "</td><td>"
            << html(partName(p, c.part)) << "</td>" << (heads ? "<td>" + QString::number(c.head) + "</td>" : QString())
            << (c.nonFinite  // no number: what the input holds, and which input
                    ? "<td class=fail>" + html(nonFiniteText(c)) + "</td><td>" + html(nonFiniteSideText(c)) + "</td><td>-</td></tr>"
                    : "<td>" + QString::number(c.ratio, 'g', 4) + "</td><td>" + QString::number(c.error, 'g', 4) + "</td><td>" +
                          QString::number(c.baseError, 'g', 4) + "</td></tr>");
    }
    out << "</table>";
    writeImpact(out, p, prompts);
    if (!p.states.empty())
        writeStates(out, p);
    if (!p.provenance.empty())
        writeSources(out, p, thresholds);
    for (const ReplicaDifference& d : p.replicaDifferences)
        out << "<p class=fail>Replicas differ: " << html(d.describe()) << "</p>";
    for (const std::string& problem : p.problems)
        out << "<p class=fail>" << html(problem) << "</p>";
}

void writeAcrossPrompts(QTextStream& out, const AggregateBc& a, const std::vector<ReportMap>& maps,
                        const Thresholds& thresholds, const std::array<std::string, 2>& parts)
{
    out << "<h2>Across prompts</h2><p>" << a.promptIds.size() << " three-way prompt(s), " << a.generationCount
        << " generation indices.</p>";
    writeMapBlocks(out, maps, "aggregate_");
    out << "<h3>Combined BC per layer</h3><table><tr><th>layer</th><th>" << html(parts[0]) << " vs noise</th><th>"
        << html(parts[1]) << " vs noise</th><th>" << html(parts[0]) << " (reference tool)</th><th>" << html(parts[1])
        << " (reference tool)</th></tr>";
    for (std::size_t l = 0; l < a.layers.size(); ++l) {
        out << "<tr><td>" << html(a.layers[l]) << "</td>";
        for (const bool vsNoise : {true, false})
            for (int part = 0; part < 2; ++part) {
                const float bc = (vsNoise ? a.combinedVsNoise : a.combined)[std::size_t(part)][l];
                const bool judged = vsNoise == thresholds.bcVsNoise;
                out << "<td class=" << (!judged ? "" : bc < thresholds.minBc ? "fail" : "pass") << ">"
                    << (std::isnan(bc) ? QString("no data") : QString::number(bc, 'f', 4)) << "</td>";
            }
        out << "</tr>";
    }
    out << "</table>";
}

// The page: the body, and the maps' data for the script, every resource inlined.
QString page(const QString& body, const std::vector<ReportMap>& maps)
{
    std::ostringstream json;
    JsonWriter w(json);
    writeScalesJson(w.beginObject().key("scales"));
    w.key("maps").array(maps.size(), [&](std::size_t i) { writeMapJson(w, maps[i]); }).endObject();
    // Inside <script>, "</" could end the element: escape it.
    const QString data = QString::fromStdString(json.str()).replace("</", "<\\/");

    return "<!DOCTYPE html><html><head><meta charset=\"utf-8\"><title>kvscope report</title><style>" +
           resource("report.css") + "</style></head><body>" + body +
           "<div id=tooltip></div><script type=\"application/json\" id=\"kvscope-data\">" + data +
           "</script><script>" + resource("report.js") + "</script></body></html>\n";
}

}  // namespace

QString whatIfCellText(const WhatIfLayer& cell)
{
    return QString("%1 / %2 · p90 %3%4")
        .arg(cell.floorRatioMedian[0], 0, 'f', 1)
        .arg(cell.floorRatioMedian[1], 0, 'f', 1)
        .arg(whatIfCellLevel(cell), 0, 'f', 1)
        .arg(cell.hurt ? "  hurt" : "");
}

double whatIfCellLevel(const WhatIfLayer& cell)
{
    return std::max(cell.floorRatioP90[0], cell.floorRatioP90[1]);
}

QColor whatIfColour(double floorRatio)
{
    if (!std::isfinite(floorRatio))
        return QColor(0xee, 0xee, 0xee);
    // Hue 120 (green) at 2 floors and below, 0 (red) at 10 and beyond, on a log scale.
    const double t = std::clamp(std::log(floorRatio / 2) / std::log(5.0), 0.0, 1.0);
    return QColor::fromHslF(float(120 * (1 - t) / 360), 0.7f, 0.8f);
}

ReportFiles writeReport(const CaptureLoader& loader, const AnalysisResult& result, const Thresholds& thresholds,
                        const QString& directory, const WhatIfResult* whatIf, const DiffResult* against)
{
    std::error_code failed;
    std::filesystem::create_directories(directory.toStdString(), failed);
    if (failed || !QDir(directory).exists())
        throw std::runtime_error(directory.toStdString() + ": the report's folder cannot be created (" +
                                 (failed ? failed.message() : "it is a file") + ")");
    const QDir dir(directory);
    const std::vector<ReportMap> maps = reportMaps(loader, result, against, thresholds.suspects);
    ReportFiles files;
    for (const ReportMap& m : maps) {
        const QString png = QString::fromStdString(m.id) + ".png";
        renderPng(m, dir.filePath(png));
        files.images << dir.filePath(png);
    }

    QString body;
    QTextStream out(&body);
    out << "<h1>kvscope report</h1><div>" << html(loader.path()) << "</div><div class=legend>written by kvscope "
        << kVersion << "</div>";
    if (!loader.holdsData())  // a results file whose bundle is elsewhere (docs/results-files.md)
        out << "<p class=legend>Read from a saved analysis (a results file). The bundle above was not at hand, so "
               "nothing here needed its KV: no what-if section.</p>";
    if (against)
        writeComparison(out, *against, result, maps);
    writeSuspects(out, result);
    writeCapture(out, loader);
    writeVerdict(out, result, thresholds);
    out << "<p class=legend>Black line: prefill | decode. Violet dashed: divergences. Hatched: no data (outside a freed "
           "sliding window, never written). Errors yellow to red from 0 to twice the dtype noise's 99th percentile "
           "(two-way: the errors' own 99th percentile). Error in floors: in units of each layer's off threshold (the "
           "suspects' rule, where noise reaches it in one capture of a hundred; in a suspect's layers the suspects' own), on a "
           "log scale: noise quiet, a ramp up to off, then red darkening to 1000x. Framed row: where the suspect starts; "
           "dimmed rows: the layers its error spreads to. BC 0..1: quiet above 0.92 (a clean layer's tokens), orange below "
           "0.9, red below 0.8.</p>";
    if (const std::optional<SweepTimeline> timeline = sweepTimeline(result, thresholds.suspects)) {
        TimelineView view;
        view.resize(1200, 360);
        view.setTimeline(*timeline);
        view.replot(QCustomPlot::rpImmediateRefresh);
        const QString png = "over_time.png";
        if (!view.savePng(dir.filePath(png), view.width(), view.height()))
            throw std::runtime_error(("cannot write " + dir.filePath(png)).toStdString());
        files.images << dir.filePath(png);
        writeOverTime(out, *timeline, png);
    }
    for (const PromptAnalysis& p : result.prompts)
        writePrompt(out, p, result.prompts, maps, thresholds.suspects);
    if (result.aggregate)
        writeAcrossPrompts(out, *result.aggregate, maps, thresholds,
                           result.prompts.empty() ? std::array<std::string, 2>{"K", "V"}
                                                  : std::array{partTitle(result.prompts.front(), KvPart::K),
                                                               partTitle(result.prompts.front(), KvPart::V)});
    if (whatIf)
        writeWhatIf(out, *whatIf, result.prompts);

    files.html = dir.filePath("report.html");
    QFile file(files.html);
    if (!file.open(QIODevice::WriteOnly) || file.write(page(body, maps).toUtf8()) < 0)
        throw std::runtime_error(("cannot write " + files.html).toStdString());
    files.htmlBytes = file.size();
    return files;
}

}  // namespace kvscope
