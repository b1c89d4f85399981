#include "analysis/analysis_json.h"

#include "analysis/analysis_fields.h"
#include "analysis/impact_json.h"
#include "analysis/state_json.h"
#include "analysis/off_floor.h"
#include "analysis/source_summary.h"
#include "analysis/sweep_timeline.h"
#include "util/json_writer.h"

namespace kvscope {

namespace {

// Per (layer, token) arrays of `[layer][token]` values, one array per layer.
void writeLayerRows(JsonWriter& w, const float* data, std::size_t layers, std::size_t perLayer)
{
    w.floatRows(data, layers, perLayer);
}

void writeLayerRows(JsonWriter& w, const SpillableArray& values, std::size_t layers, std::size_t perLayer)
{
    w.array(layers, [&](std::size_t l) {
        w.floatRow(values.data() + l * perLayer, perLayer);
        values.release(l * perLayer, perLayer);
    });
}

// Per source of the prompt's positions (where the capture recorded provenance).
void writeSources(JsonWriter& w, const PromptAnalysis& p, const SuspectThresholds& thresholds, const CellRatioMaxima& ratios)
{
    const std::vector<SourceSummary> sources = summarizeBySource(p, p.provenance, finalMapOffThresholds(p, thresholds), &ratios);
    w.array(sources.size(), [&](std::size_t i) {
        const SourceSummary& s = sources[i];
        w.beginObject()
            .field("source", s.source)
            .field("kind", provenanceKindName(s.kind))
            .key("spans")
            .array(s.spans.size(), [&](std::size_t k) { w.numbers(std::vector<std::int64_t>{s.spans[k].first, s.spans[k].second}); })
            .field("positions", s.positions)
            .field("cells", s.cells)
            .field("off_cells", s.offCells)
            .field("non_finite", s.nonFinite)
            .key("worst");
        if (s.worstLayer < 0)
            w.null();
        else
            w.beginObject()
                .field("ratio", s.worstRatio)
                .field("layer", p.layers[std::size_t(s.worstLayer)])
                .field("token", s.worstToken)
                .field("part", p.partNames[std::size_t(s.worstPart)])
                .endObject();
        w.key("layer_worst").floatRow(s.layerWorst.data(), s.layerWorst.size());
        w.endObject();
    });
}

void writePrompt(JsonWriter& w, const PromptAnalysis& p, const SuspectThresholds& thresholds)
{
    writePromptShape(w.beginObject(), p);
    // (the divergences' positions alone, for readers of the JSON: the record does without)
    w.key("divergence_positions").array(p.divergences.size(), [&](std::size_t i) { w.value(p.divergences[i].position); });
    writePromptDivergences(w, p);

    const std::size_t layers = p.layers.size(), tokens = std::size_t(p.tokens), heads = std::size_t(p.heads);
    w.key("metrics").beginObject();
    for (int m = 0; m < kMetricCount; ++m) {
        if (isBaseMetric(Metric(m)) && !p.threeWay)
            continue;
        const SpillableArray& values = p.metrics[std::size_t(m)];
        w.key(metricName(Metric(m))).floatBlocks(values.data(), layers, tokens, heads, [&](std::size_t first, std::size_t count) {
            values.release(first, count);  // (spilled results: a piece in hand at a time)
        });
    }
    w.endObject();
    // What kvscope diff compares: each cell's ratio in floors, the largest over its heads.
    const CellRatioMaxima ratios = cellRatioMaxima(p);
    w.key("error_ratios").beginObject();
    writeLayerRows(w.key("k"), ratios[0].data(), layers, tokens);
    writeLayerRows(w.key("v"), ratios[1].data(), layers, tokens);
    w.endObject();
    if (p.threeWay) {
        w.key("bc").beginObject();
        writeLayerRows(w.key("k_bc"), p.bc[0], layers, tokens);
        writeLayerRows(w.key("v_bc"), p.bc[1], layers, tokens);
        w.endObject().key("bc_vs_noise").beginObject();
        writeLayerRows(w.key("k"), p.bcVsNoise[0], layers, tokens);
        writeLayerRows(w.key("v"), p.bcVsNoise[1], layers, tokens);
        w.endObject();
    }
    writePromptFindings(w, p);
    if (!p.states.empty())
        writeStates(w.key("states"), p.states);
    if (p.impact)
        writePromptImpact(w.key("impact"), *p.impact);
    if (!p.provenance.empty())
        writeSources(w.key("sources"), p, thresholds, ratios);  // (the error_ratios above, not computed again)
    w.endObject();
}

// A soak run's statistic per capture (or request) against time (analysis/sweep_timeline.h).
void writeTimeline(JsonWriter& w, const SweepTimeline& t)
{
    w.beginObject()
        .field("points_are", t.perBundle ? "bundles" : "prompts")
        .field("x", t.byTime ? "seconds since the first capture" : t.perBundle ? "bundle index" : "request index")
        .field("rank_correlation", t.rankCorrelation)
        .field("trend", t.trend.empty() ? std::optional<std::string>() : t.trend)
        .key("points")
        .array(t.points.size(), [&](std::size_t i) {
            const TimelinePoint& p = t.points[i];
            w.beginObject()
                .field("name", p.name)
                .field("created", p.created.empty() ? std::optional<std::string>() : p.created)
                .field("x", p.x)
                .field("prompts", p.prompts)
                .field("worst_ratio", p.worstRatio)
                .field("off_fraction", p.offFraction)
                .field("prompts_with_suspect", p.suspects)
                .endObject();
        })
        .endObject();
}

}  // namespace

void writeAnalysisJson(const AnalysisResult& result, std::ostream& out, const SuspectThresholds& thresholds)
{
    JsonWriter w(out);
    w.beginObject()
        .field("format", "kvscope-analysis")
        .field("format_version", 1)
        .field("bundle", result.bundle);
    if (!result.bundles.empty())  // a sweep: every bundle given, those left out with why
        w.key("bundles").array(result.bundles.size(), [&](std::size_t i) {
            const SweepBundle& b = result.bundles[i];
            w.beginObject()
                .field("name", b.name)
                .field("path", b.path)
                .field("analysed", b.problem.empty())
                .field("problem", b.problem.empty() ? std::optional<std::string>() : b.problem)
                .field("created", b.created.empty() ? std::optional<std::string>() : b.created)
                .endObject();
        });
    if (const std::optional<SweepTimeline> timeline = sweepTimeline(result, thresholds))
        writeTimeline(w.key("timeline"), *timeline);
    w.key("layout")
        .beginObject()
        .field("metrics", "[layer][token][head]")
        .field("bc", "[layer][token]")
        .field("aggregate_bc", "[layer][generation_index]")
        .endObject();
    writeDocumentFindings(w, result);
    w.key("prompts").array(result.prompts.size(), [&](std::size_t i) { writePrompt(w, result.prompts[i], thresholds); });
    writeAggregateFields(w, result.aggregate, AggregateRows::WithPerGeneration);
    w.endObject();
    out << '\n';
}

}  // namespace kvscope
