#include "results/analysis_record.h"

#include "analysis/analysis_json.h"
#include "util/content_hash.h"
#include "util/json_writer.h"

#include <cmath>

namespace kvscope {

namespace {

using Json = JsonFields::Json;

const SuspectPattern kPatterns[] = {SuspectPattern::Block,      SuspectPattern::TpRank, SuspectPattern::Head,
                                    SuspectPattern::Position,   SuspectPattern::WindowEdge,
                                    SuspectPattern::Layer,      SuspectPattern::Unexplained};
const ScaleGranularity kGranularities[] = {ScaleGranularity::Tensor, ScaleGranularity::Head,
                                           ScaleGranularity::TokenHead, ScaleGranularity::TokenGroup};

KvPart partNamed(const JsonFields& f, const std::string& name, const std::string& where)
{
    if (name != "k" && name != "v")
        f.fail(where, "is '" + name + "', not k or v");
    return name == "k" ? KvPart::K : KvPart::V;
}

std::optional<std::int64_t> optionalInteger(const JsonFields& f, const Json& o, const char* key, const std::string& where)
{
    if (f.at(o, key, where).is_null())
        return std::nullopt;
    return f.integer(o, key, where);
}

std::optional<double> optionalNumber(const JsonFields& f, const Json& o, const char* key, const std::string& where)
{
    if (f.at(o, key, where).is_null())
        return std::nullopt;
    return f.number(o, key, where);
}

// A hypothesis as writeSuspectsJson writes it (null: none could be tested).
Hypothesis readHypothesis(const JsonFields& f, const Json& h, const std::string& where)
{
    Hypothesis out;
    if (h.is_null())
        return out;
    out.kind = f.text(h, "kind", where);
    const Json& parameters = f.at(h, "parameters", where);
    if (!parameters.is_object())
        f.fail(where + "parameters", "must be an object");
    for (const auto& [name, value] : parameters.items()) {
        if (!value.is_number() && !value.is_null())
            f.fail(where + "parameters." + name, "must be a number");
        out.parameters.emplace_back(name, value.is_null() ? std::nan("") : value.get<double>());
    }
    out.text = f.text(h, "text", where);
    out.residualFloors = f.number(h, "residual_floors", where);
    out.errorFloors = f.number(h, "error_floors", where);
    out.explainedShare = f.number(h, "explained_share", where);
    return out;
}

std::vector<Suspect> readSuspects(const JsonFields& f, const Json& list, const std::string& where)
{
    if (!list.is_array())
        f.fail(where, "must be an array");
    std::vector<Suspect> out;
    for (std::size_t i = 0; i < list.size(); ++i) {
        const Json& j = list[i];
        const std::string at = where + "[" + std::to_string(i) + "].";
        Suspect s;
        const std::string pattern = f.text(j, "pattern", at);
        bool known = false;
        for (SuspectPattern p : kPatterns)
            if (pattern == suspectPatternName(p)) {
                s.pattern = p;
                known = true;
            }
        if (!known)
            f.fail(at + "pattern", "'" + pattern + "' is not a suspect pattern");
        s.score = f.number(j, "score", at);
        s.evidence = f.text(j, "evidence", at);
        s.evidencePrompt = f.text(j, "evidence_prompt", at);
        s.hypothesis = readHypothesis(f, f.at(j, "hypothesis", at), at + "hypothesis.");
        const Json& tried = f.array(j, "tried", at);
        for (std::size_t h = 0; h < tried.size(); ++h)
            s.tried.push_back(readHypothesis(f, tried[h], at + "tried[" + std::to_string(h) + "]."));
        s.prompts = f.texts(j, "prompts", at);
        s.firstLayer = f.text(j, "first_layer", at);
        s.layers = f.texts(j, "layers", at);
        s.kv = f.text(j, "kv", at);
        s.heads = f.ints(j, "heads", at);
        s.tpRanks = f.ints(j, "tp_ranks", at);
        s.dcpRanks = f.ints(j, "dcp_ranks", at);
        if (!f.at(j, "tokens", at).is_null()) {
            const std::vector<std::int64_t> tokens = f.integers(j, "tokens", at);
            if (tokens.size() != 2)
                f.fail(at + "tokens", "must be [first, last]");
            s.firstToken = tokens[0];
            s.lastToken = tokens[1];
        }
        const Json& shared = f.at(j, "shared_block", at);
        if (!shared.is_null()) {
            s.sharedBlock = f.integer(shared, "physical", at + "shared_block.");
            s.sharedBy = f.texts(shared, "prompts", at + "shared_block.");
        }
        s.phase = f.text(j, "phase", at);
        const Json& blocks = f.array(j, "blocks", at);
        for (std::size_t b = 0; b < blocks.size(); ++b) {
            const std::string bt = at + "blocks[" + std::to_string(b) + "].";
            SuspectBlock block;
            block.group = int(f.integer(blocks[b], "group", bt));
            block.logical = f.integer(blocks[b], "logical", bt);
            block.physical = optionalInteger(f, blocks[b], "physical", bt).value_or(-1);
            s.blocks.push_back(block);
        }
        const Json& worst = f.at(j, "worst_cell", at);
        s.worstLayer = int(f.integer(worst, "layer", at + "worst_cell."));
        s.worstToken = f.integer(worst, "token", at + "worst_cell.");
        s.worstHead = int(f.integer(worst, "head", at + "worst_cell."));
        s.worstPart = partNamed(f, f.text(worst, "part", at + "worst_cell."), at + "worst_cell.part");
        out.push_back(std::move(s));
    }
    return out;
}

void writeFloatsOf(JsonWriter& w, const std::vector<float>& values)
{
    w.floats(values.data(), values.size());
}

void writePrompt(JsonWriter& w, const PromptAnalysis& p)
{
    w.beginObject()
        .field("id", p.id)
        .key("input_ids")
        .numbers(p.inputIds)
        .key("reference_fingerprints")
        .array(2, [&](std::size_t role) {
            w.array(p.referenceHashes[role].size(), [&](std::size_t l) { w.value(hexFingerprint(p.referenceHashes[role][l])); });
        })
        .field("prompt_len", p.promptLen)
        .field("tokens", p.tokens)
        .field("heads", p.heads)
        .key("layer_heads")
        .numbers(p.layerHeads)
        .key("dims")
        .numbers(std::vector<int>{p.dims.k, p.dims.v})
        .key("layer_dims")
        .array(p.layerDims.size(), [&](std::size_t l) { w.numbers(std::vector<int>{p.layerDims[l].k, p.layerDims[l].v}); })
        .key("part_names")
        .strings({p.partNames[0], p.partNames[1]})
        .field("three_way", p.threeWay)
        .key("layers")
        .strings(p.layers)
        .key("layer_groups")
        .numbers(p.layerGroups)
        .key("layer_dtypes")
        .array(p.layerDtypes.size(), [&](std::size_t l) { w.value(dtypeName(p.layerDtypes[l])); })
        .key("cache_scales")
        .array(p.cacheScales.size(), [&](std::size_t l) {
            const CacheScales& c = p.cacheScales[l];
            w.beginObject().field("granularity", granularityName(c.granularity)).key("k");
            writeFloatsOf(w, c.heads[0]);
            w.key("v");
            writeFloatsOf(w, c.heads[1]);
            w.endObject();
        })
        .key("divergences");
    writeDivergencesJson(w, p.divergences);
    writeNonFiniteJson(w.key("non_finite"), p.nonFinite);
    writeReplicaDifferencesJson(w.key("problems").strings(p.problems).key("replica_differences"), p.replicaDifferences);
    writeSuspectsJson(w.key("suspects"), p.suspects);
    w.endObject();
}

std::vector<Divergence> readDivergences(const JsonFields& f, const Json& list, const std::string& where)
{
    std::vector<Divergence> out;
    for (std::size_t i = 0; i < list.size(); ++i) {
        const std::string at = where + "[" + std::to_string(i) + "].";
        const Json& d = list[i];
        Divergence div;
        div.position = f.integer(d, "position", at);
        div.derived = f.boolean(d, "derived", at);
        div.engineToken = optionalInteger(f, d, "engine_token", at);
        div.teacherToken = optionalInteger(f, d, "teacher_token", at);
        div.logitGap = optionalNumber(f, d, "logit_gap", at);
        div.ulpBound = optionalNumber(f, d, "ulp_bound", at);
        if (!f.at(d, "in_bounds", at).is_null())
            div.inBounds = f.boolean(d, "in_bounds", at);
        out.push_back(div);
    }
    return out;
}

std::vector<NonFiniteCell> readNonFinite(const JsonFields& f, const Json& list, const std::string& where)
{
    std::vector<NonFiniteCell> out;
    for (std::size_t i = 0; i < list.size(); ++i) {
        const std::string at = where + "[" + std::to_string(i) + "].";
        NonFiniteCell c;
        c.layer = int(f.integer(list[i], "layer", at));
        c.token = f.integer(list[i], "token", at);
        c.head = int(f.integer(list[i], "head", at));
        c.part = partNamed(f, f.text(list[i], "part", at), at + "part");
        c.side = f.text(list[i], "side", at);
        out.push_back(c);
    }
    return out;
}

std::vector<ReplicaDifference> readReplicaDifferences(const JsonFields& f, const Json& list, const std::string& where)
{
    std::vector<ReplicaDifference> out;
    for (std::size_t i = 0; i < list.size(); ++i) {
        const std::string at = where + "[" + std::to_string(i) + "].";
        const Json& r = list[i];
        ReplicaDifference d;
        d.layer = f.text(r, "layer", at);
        d.snapshot = std::size_t(f.integer(r, "snapshot", at));
        d.rank = int(f.integer(r, "rank", at));
        d.againstRank = int(f.integer(r, "against_rank", at));
        d.part = f.text(r, "part", at);
        d.physicalBlock = f.integer(r, "physical_block", at);
        d.logicalBlock = f.integer(r, "logical_block", at);
        const std::vector<std::int64_t> positions = f.integers(r, "positions", at);
        if (positions.size() != 2)
            f.fail(at + "positions", "must be [first, last]");
        d.firstPosition = positions[0];
        d.lastPosition = positions[1];
        d.blocks = int(f.integer(r, "blocks", at));
        out.push_back(d);
    }
    return out;
}

PromptAnalysis readPrompt(const JsonFields& f, const Json& j, const std::string& where)
{
    PromptAnalysis p;
    p.id = f.text(j, "id", where);
    p.inputIds = f.integers(j, "input_ids", where);
    const Json& hashes = f.array(j, "reference_fingerprints", where);
    if (hashes.size() != 2)
        f.fail(where + "reference_fingerprints", "must hold [expected, baseline]");
    p.promptLen = f.integer(j, "prompt_len", where);
    p.tokens = f.integer(j, "tokens", where);
    p.heads = int(f.integer(j, "heads", where));
    p.layerHeads = f.ints(j, "layer_heads", where);
    const std::vector<int> dims = f.ints(j, "dims", where);
    if (dims.size() != 2)
        f.fail(where + "dims", "must be [k, v]");
    p.dims.k = dims[0];
    p.dims.v = dims[1];
    const Json& layerDims = f.array(j, "layer_dims", where);
    for (std::size_t l = 0; l < layerDims.size(); ++l) {
        if (!layerDims[l].is_array() || layerDims[l].size() != 2 || !layerDims[l][0].is_number_integer() ||
            !layerDims[l][1].is_number_integer())
            f.fail(where + "layer_dims[" + std::to_string(l) + "]", "must be [k, v]");
        HeadDims d;
        d.k = layerDims[l][0].get<int>();
        d.v = layerDims[l][1].get<int>();
        p.layerDims.push_back(d);
    }
    const std::vector<std::string> partNames = f.texts(j, "part_names", where);
    if (partNames.size() != 2)
        f.fail(where + "part_names", "must name K and V");
    p.partNames = {partNames[0], partNames[1]};
    p.threeWay = f.boolean(j, "three_way", where);
    p.layers = f.texts(j, "layers", where);
    p.layerGroups = f.ints(j, "layer_groups", where);
    for (const std::string& name : f.texts(j, "layer_dtypes", where)) {
        const std::optional<DType> dtype = parseDType(name);
        if (!dtype)
            f.fail(where + "layer_dtypes", "'" + name + "' is not a dtype");
        p.layerDtypes.push_back(*dtype);
    }
    const std::size_t layers = p.layers.size();
    if (p.tokens < 0 || p.tokens > (std::int64_t(1) << 24) || p.heads < 0 || p.heads > 4096)
        f.fail(where + "tokens", "tokens " + std::to_string(p.tokens) + " or heads " + std::to_string(p.heads) +
                                     " outside what an analysis can have");
    if (p.layerHeads.size() != layers || p.layerDims.size() != layers || p.layerGroups.size() != layers ||
        p.layerDtypes.size() != layers)
        f.fail(where + "layers", "layer_heads, layer_dims, layer_groups and layer_dtypes must have one entry per layer");
    for (std::size_t role = 0; role < 2; ++role) {
        const std::string at = where + "reference_fingerprints[" + std::to_string(role) + "]";
        if (!hashes[role].is_array() || hashes[role].size() != layers)
            f.fail(at, "must hold one fingerprint per layer");
        for (std::size_t l = 0; l < layers; ++l)
            p.referenceHashes[role].push_back(f.fingerprint(hashes[role][l], at + "[" + std::to_string(l) + "]"));
    }
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
    p.divergences = readDivergences(f, f.array(j, "divergences", where), where + "divergences");
    p.nonFinite = readNonFinite(f, f.array(j, "non_finite", where), where + "non_finite");
    p.problems = f.texts(j, "problems", where);
    p.replicaDifferences = readReplicaDifferences(f, f.array(j, "replica_differences", where),
                                                  where + "replica_differences");
    p.suspects = readSuspects(f, f.at(j, "suspects", where), where + "suspects");
    return p;
}

void writeAggregate(JsonWriter& w, const AggregateBc& a)
{
    w.beginObject()
        .key("prompt_ids")
        .strings(a.promptIds)
        .key("layers")
        .strings(a.layers)
        .field("generation_count", a.generationCount)
        .key("divergence_counts")
        .numbers(a.divergenceCounts);
    // (bc and bc_vs_noise, [layer][generation index], are datasets of the results file: as
    // JSON they took seconds to parse at 128k tokens)
    const std::pair<const char*, const std::array<std::vector<float>, 2>*> arrays[] = {
        {"combined", &a.combined}, {"combined_vs_noise", &a.combinedVsNoise}};
    for (const auto& [name, pair] : arrays) {
        w.key(name).beginArray();
        writeFloatsOf(w, (*pair)[0]);
        writeFloatsOf(w, (*pair)[1]);
        w.endArray();
    }
    w.endObject();
}

AggregateBc readAggregate(const JsonFields& f, const Json& j, const std::string& where)
{
    AggregateBc a;
    a.promptIds = f.texts(j, "prompt_ids", where);
    a.layers = f.texts(j, "layers", where);
    a.generationCount = f.integer(j, "generation_count", where);
    a.divergenceCounts = f.ints(j, "divergence_counts", where);
    const std::size_t layers = a.layers.size(), g = std::size_t(std::max<std::int64_t>(a.generationCount, 0));
    const std::pair<const char*, std::array<std::vector<float>, 2>*> arrays[] = {
        {"bc", &a.bc}, {"combined", &a.combined}, {"bc_vs_noise", &a.bcVsNoise}, {"combined_vs_noise", &a.combinedVsNoise}};
    for (const auto& [name, pair] : arrays) {
        const bool perGeneration = std::string(name) == "bc" || std::string(name) == "bc_vs_noise";
        if (perGeneration && !j.contains(name))
            continue;  // format 2: datasets of the results file (results_file.cpp reads them)
        const Json& parts = f.array(j, name, where);
        if (parts.size() != 2)
            f.fail(where + name, "must hold K and V");
        for (std::size_t part = 0; part < 2; ++part) {
            const Json holder = Json{{"values", parts[part]}};
            (*pair)[part] = f.floats(holder, "values", where + name + "[" + std::to_string(part) + "].");
            if ((*pair)[part].size() != layers * (perGeneration ? g : 1))
                f.fail(where + name + "[" + std::to_string(part) + "]", "has " + std::to_string((*pair)[part].size()) +
                                                                            " values for " + std::to_string(layers) + " layers");
        }
    }
    return a;
}

}  // namespace

RecordedOptions recordedOptions(const AnalysisOptions& options)
{
    return {options.suspects, options.searchSuspects, options.bc, options.unreadableBlocks};
}

void writeAnalysisRecord(JsonWriter& w, const AnalysisResult& result, const RecordedOptions& options)
{
    const SuspectThresholds& t = options.suspects;
    w.beginObject()
        .field("bundle", result.bundle)
        .key("options")
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
        .endObject()
        .key("problems")
        .strings(result.problems)
        .key("not_compared")
        .array(result.notCompared.size(), [&](std::size_t i) {
            w.beginArray().value(result.notCompared[i].first).value(result.notCompared[i].second).endArray();
        });
    writeSuspectsJson(w.key("suspects"), result.suspects);
    w.key("prompts").array(result.prompts.size(), [&](std::size_t i) { writePrompt(w, result.prompts[i]); });
    w.key("aggregate");
    if (result.aggregate)
        writeAggregate(w, *result.aggregate);
    else
        w.null();
    w.endObject();
}

AnalysisResult readAnalysisRecord(const JsonFields& f, const Json& document, RecordedOptions& options)
{
    AnalysisResult result;
    result.bundle = f.text(document, "bundle", "");
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
    result.problems = f.texts(document, "problems", "");
    const Json& notCompared = f.array(document, "not_compared", "");
    for (std::size_t i = 0; i < notCompared.size(); ++i) {
        const Json& pair = notCompared[i];
        if (!pair.is_array() || pair.size() != 2 || !pair[0].is_string() || !pair[1].is_string())
            f.fail("not_compared[" + std::to_string(i) + "]", "must be [layer, what]");
        result.notCompared.emplace_back(pair[0].get<std::string>(), pair[1].get<std::string>());
    }
    result.suspects = readSuspects(f, f.at(document, "suspects", ""), "suspects");
    const Json& prompts = f.array(document, "prompts", "");
    for (std::size_t i = 0; i < prompts.size(); ++i)
        result.prompts.push_back(readPrompt(f, prompts[i], "prompts[" + std::to_string(i) + "]."));
    if (!f.at(document, "aggregate", "").is_null())
        result.aggregate = readAggregate(f, document["aggregate"], "aggregate.");
    return result;
}

}  // namespace kvscope
