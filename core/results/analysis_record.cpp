#include "results/analysis_record.h"

#include "analysis/analysis_fields.h"
#include "analysis/impact_json.h"
#include "util/json_writer.h"

namespace kvscope {

namespace {

using Json = JsonFields::Json;

const ScaleGranularity kGranularities[] = {ScaleGranularity::Tensor, ScaleGranularity::Head,
                                           ScaleGranularity::TokenHead, ScaleGranularity::TokenGroup};

void writeFloatsOf(JsonWriter& w, const std::vector<float>& values)
{
    w.floats(values.data(), values.size());
}

// The record's own fields of a prompt: its cache's dtype and scales per layer.
void writeCacheFields(JsonWriter& w, const PromptAnalysis& p)
{
    w.key("layer_dtypes")
        .array(p.layerDtypes.size(), [&](std::size_t l) { w.value(dtypeName(p.layerDtypes[l])); })
        .key("cache_scales")
        .array(p.cacheScales.size(), [&](std::size_t l) {
            const CacheScales& c = p.cacheScales[l];
            w.beginObject().field("granularity", granularityName(c.granularity)).key("k");
            writeFloatsOf(w, c.heads[0]);
            w.key("v");
            writeFloatsOf(w, c.heads[1]);
            w.endObject();
        });
}

void readCacheFields(const JsonFields& f, const Json& j, const std::string& where, PromptAnalysis& p)
{
    const std::size_t layers = p.layers.size();
    for (const std::string& name : f.texts(j, "layer_dtypes", where)) {
        const std::optional<DType> dtype = parseDType(name);
        if (!dtype)
            f.fail(where + "layer_dtypes", "'" + name + "' is not a dtype");
        p.layerDtypes.push_back(*dtype);
    }
    if (p.layerDtypes.size() != layers)
        f.fail(where + "layer_dtypes", "must hold one entry per layer");
    const Json& scales = f.array(j, "cache_scales", where);
    if (scales.size() != layers)
        f.fail(where + "cache_scales", "must hold one entry per layer");
    p.cacheScales.resize(layers);
    for (std::size_t l = 0; l < layers; ++l) {
        const std::string at = where + "cache_scales[" + std::to_string(l) + "].";
        const std::string granularity = f.text(scales[l], "granularity", at);
        bool known = false;
        for (ScaleGranularity g : kGranularities)
            if (granularity == granularityName(g)) {
                p.cacheScales[l].granularity = g;
                known = true;
            }
        if (!known)
            f.fail(at + "granularity", "'" + granularity + "' is not a scale granularity");
        p.cacheScales[l].heads[0] = f.floats(scales[l], "k", at);
        p.cacheScales[l].heads[1] = f.floats(scales[l], "v", at);
    }
}

// The analysis JSON's prompt without its per-cell arrays, and with the cache's dtypes and scales.
void writePrompt(JsonWriter& w, const PromptAnalysis& p)
{
    writePromptShape(w.beginObject(), p);
    writeCacheFields(w, p);
    writePromptDivergences(w, p);
    writePromptFindings(w, p);
    if (p.impact)
        writePromptImpact(w.key("impact"), *p.impact);
    w.endObject();
}

PromptAnalysis readPrompt(const JsonFields& f, const Json& j, const std::string& where)
{
    PromptAnalysis p;
    readPromptShape(f, j, where, p);
    readCacheFields(f, j, where, p);
    readPromptDivergences(f, j, where, p);
    readPromptFindings(f, j, where, p);
    p.impact = readPromptImpact(f, j, where);
    return p;
}

void writeOptions(JsonWriter& w, const RecordedOptions& options)
{
    const SuspectThresholds& t = options.suspects;
    w.key("options")
        .beginObject()
        .field("search_suspects", options.searchSuspects)
        .field("bc", options.bc)
        .field("unreadable_blocks", options.unreadableBlocks == UnreadableBlockPolicy::Error ? "error" : "absent")
        .key("suspect_thresholds")
        .beginObject()
        .field("off_floor", t.offFloor)
        .field("per_decade", t.perDecade)
        .field("two_way_drift", t.twoWayDrift)
        .field("two_way_drift_per_decade", t.twoWayDriftPerDecade)
        .field("min_cells", t.minCells)
        .field("false_layer_chance", t.falseLayerChance)
        .field("explained", t.explained)
        .endObject()
        .endObject();
}

RecordedOptions readOptions(const JsonFields& f, const Json& document)
{
    RecordedOptions options;
    const Json& o = f.at(document, "options", "");
    options.searchSuspects = f.boolean(o, "search_suspects", "options.");
    options.bc = f.boolean(o, "bc", "options.");
    options.unreadableBlocks = f.text(o, "unreadable_blocks", "options.") == "error" ? UnreadableBlockPolicy::Error
                                                                                      : UnreadableBlockPolicy::MarkAbsent;
    const Json& t = f.at(o, "suspect_thresholds", "options.");
    const std::string at = "options.suspect_thresholds.";
    options.suspects.offFloor = f.number(t, "off_floor", at);
    options.suspects.perDecade = f.number(t, "per_decade", at);
    options.suspects.twoWayDrift = f.number(t, "two_way_drift", at);
    options.suspects.twoWayDriftPerDecade = f.number(t, "two_way_drift_per_decade", at);
    options.suspects.minCells = int(f.integer(t, "min_cells", at));
    // (Files from before the noise count have none: the rule was not applied, which check then names.)
    options.suspects.falseLayerChance = t.contains("false_layer_chance") ? f.number(t, "false_layer_chance", at) : 0.0;
    options.suspects.explained = f.number(t, "explained", at);
    return options;
}

}  // namespace

RecordedOptions recordedOptions(const AnalysisOptions& options)
{
    // (an analysis that left some BCs out is kept as one without: a reader would take NaN for no data)
    return {options.suspects, options.searchSuspects, options.bcs && options.bcs->all(), options.unreadableBlocks};
}

void writeAnalysisRecord(JsonWriter& w, const AnalysisResult& result, const RecordedOptions& options)
{
    w.beginObject().field("bundle", result.bundle);
    writeOptions(w, options);
    writeDocumentFindings(w, result);
    w.key("prompts").array(result.prompts.size(), [&](std::size_t i) { writePrompt(w, result.prompts[i]); });
    writeAggregateFields(w, result.aggregate, AggregateRows::CombinedOnly);
    w.endObject();
}

AnalysisResult readAnalysisRecord(const JsonFields& f, const Json& document, RecordedOptions& options)
{
    AnalysisResult result;
    result.bundle = f.text(document, "bundle", "");
    options = readOptions(f, document);
    readDocumentFindings(f, document, result);
    const Json& prompts = f.array(document, "prompts", "");
    for (std::size_t i = 0; i < prompts.size(); ++i)
        result.prompts.push_back(readPrompt(f, prompts[i], "prompts[" + std::to_string(i) + "]."));
    // Only a format 1 record holds the rows by generation index (upgraded: results/record_upgrade.h).
    const Json& a = f.at(document, "aggregate", "");
    const bool rows = a.is_object() && a.contains("k_bc");
    result.aggregate = readAggregateFields(f, document, rows ? AggregateRows::WithPerGeneration : AggregateRows::CombinedOnly);
    return result;
}

}  // namespace kvscope
