#include "analysis/analysis_json.h"

#include "analysis/analysis_fields.h"
#include "analysis/off_floor.h"
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

void writePrompt(JsonWriter& w, const PromptAnalysis& p)
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
        w.key(metricName(Metric(m))).array(layers, [&](std::size_t l) {
            w.floatRows(values.data() + l * tokens * heads, tokens, heads);
            values.release(l * tokens * heads, tokens * heads);  // (spilled results: a layer in hand at a time)
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
    w.endObject();
}

}  // namespace

void writeAnalysisJson(const AnalysisResult& result, std::ostream& out)
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
                .endObject();
        });
    w.key("layout")
        .beginObject()
        .field("metrics", "[layer][token][head]")
        .field("bc", "[layer][token]")
        .field("aggregate_bc", "[layer][generation_index]")
        .endObject();
    writeDocumentFindings(w, result);
    w.key("prompts").array(result.prompts.size(), [&](std::size_t i) { writePrompt(w, result.prompts[i]); });
    writeAggregateFields(w, result.aggregate, AggregateRows::WithPerGeneration);
    w.endObject();
    out << '\n';
}

}  // namespace kvscope
