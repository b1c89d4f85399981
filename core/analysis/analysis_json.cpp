#include "analysis/analysis_json.h"

#include "analysis/off_floor.h"
#include "analysis/suspect.h"
#include "util/content_hash.h"
#include "util/json_writer.h"

namespace kvscope {

namespace {

// A hypothesis (null when none could be tested).
void writeHypothesis(JsonWriter& w, const Hypothesis& h)
{
    if (h.kind.empty()) {
        w.null();
        return;
    }
    w.beginObject().field("kind", h.kind).key("parameters").beginObject();
    for (const auto& [name, value] : h.parameters)
        w.field(name, value);
    w.endObject()
        .field("text", h.text)
        .field("residual_floors", h.residualFloors)
        .field("error_floors", h.errorFloors)
        .field("explained_share", h.explainedShare)
        .endObject();
}

}  // namespace

void writeSuspectsJson(JsonWriter& w, const std::vector<Suspect>& suspects)
{
    w.array(suspects.size(), [&](std::size_t i) {
        const Suspect& s = suspects[i];
        w.beginObject()
            .field("pattern", suspectPatternName(s.pattern))
            .field("score", s.score)
            .field("evidence", s.evidence)
            .field("evidence_prompt", s.evidencePrompt)
            .key("hypothesis");
        writeHypothesis(w, s.hypothesis);
        w.key("tried").array(s.tried.size(), [&](std::size_t h) { writeHypothesis(w, s.tried[h]); });
        w.key("prompts")
            .strings(s.prompts)
            .field("first_layer", s.firstLayer)
            .key("layers")
            .strings(s.layers)
            .field("kv", s.kv)
            .key("heads")
            .numbers(s.heads)
            .key("tp_ranks")
            .numbers(s.tpRanks)
            .key("dcp_ranks")
            .numbers(s.dcpRanks)
            .key("tokens");
        if (s.firstToken < 0)
            w.null();
        else
            w.beginArray().value(s.firstToken).value(s.lastToken).endArray();
        w.key("shared_block");  // prefix caching: the onset's block when other prompts share it
        if (s.sharedBlock < 0)
            w.null();
        else
            w.beginObject().field("physical", s.sharedBlock).key("prompts").strings(s.sharedBy).endObject();
        w.field("phase", s.phase).key("blocks").array(s.blocks.size(), [&](std::size_t b) {
            const SuspectBlock& block = s.blocks[b];
            w.beginObject().field("group", block.group).field("logical", block.logical).key("physical");
            if (block.physical < 0)
                w.null();
            else
                w.value(block.physical);
            w.endObject();
        });
        w.key("worst_cell")
            .beginObject()
            .field("layer", s.worstLayer)
            .field("token", s.worstToken)
            .field("head", s.worstHead)
            .field("part", kvPartName(s.worstPart))
            .endObject()
            .endObject();
    });
}

void writeDivergencesJson(JsonWriter& w, const std::vector<Divergence>& divergences)
{
    w.array(divergences.size(), [&](std::size_t i) {
        const Divergence& d = divergences[i];
        w.beginObject()
            .field("position", d.position)
            .field("derived", d.derived)
            .field("engine_token", d.engineToken)
            .field("teacher_token", d.teacherToken)
            .field("logit_gap", d.logitGap)
            .field("ulp_bound", d.ulpBound)
            .field("in_bounds", d.inBounds)
            .endObject();
    });
}

void writeNonFiniteJson(JsonWriter& w, const std::vector<NonFiniteCell>& cells)
{
    w.array(cells.size(), [&](std::size_t i) {
        const NonFiniteCell& c = cells[i];
        w.beginObject()
            .field("layer", c.layer)
            .field("token", c.token)
            .field("head", c.head)
            .field("part", kvPartName(c.part))
            .field("side", c.side)
            .endObject();
    });
}

void writeReplicaDifferencesJson(JsonWriter& w, const std::vector<ReplicaDifference>& differences)
{
    w.array(differences.size(), [&](std::size_t i) {
        const ReplicaDifference& d = differences[i];
        w.beginObject()
            .field("layer", d.layer)
            .field("snapshot", std::int64_t(d.snapshot))
            .field("rank", d.rank)
            .field("against_rank", d.againstRank)
            .field("part", d.part)
            .field("physical_block", d.physicalBlock)
            .field("logical_block", d.logicalBlock)
            .key("positions")
            .numbers(std::vector<std::int64_t>{d.firstPosition, d.lastPosition})
            .field("blocks", d.blocks)
            .field("text", d.describe())
            .endObject();
    });
}

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
    w.beginObject()
        .field("id", p.id)
        .key("input_ids")
        .numbers(p.inputIds)
        .key("reference_fingerprints")
        .beginObject()
        .key("expected")
        .array(p.referenceHashes[0].size(), [&](std::size_t l) { w.value(hexFingerprint(p.referenceHashes[0][l])); })
        .key("baseline");
    if (p.threeWay)
        w.array(p.referenceHashes[1].size(), [&](std::size_t l) { w.value(hexFingerprint(p.referenceHashes[1][l])); });
    else
        w.null();
    w.endObject()
        .field("mode", p.threeWay ? "three-way" : "two-way")
        .field("prompt_len", p.promptLen)
        .field("num_tokens", p.tokens)
        .field("num_heads", p.heads)
        .field("head_dim", p.dims.k)
        .field("v_head_dim", p.dims.v)
        .key("layer_head_dims")
        .array(p.layerDims.size(), [&](std::size_t l) { w.numbers(std::vector<int>{p.layerDims[l].k, p.layerDims[l].v}); })
        .key("layer_heads")
        .numbers(p.layerHeads)
        .key("part_names")
        .strings(std::vector<std::string>(p.partNames.begin(), p.partNames.end()))
        .key("layer_names")
        .strings(p.layers)
        .key("layer_groups")
        .numbers(p.layerGroups)
        .key("divergence_positions")
        .array(p.divergences.size(), [&](std::size_t i) { w.value(p.divergences[i].position); })
        .key("divergences");
    writeDivergencesJson(w, p.divergences);

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
    writeSuspectsJson(w.key("suspects"), p.suspects);
    writeReplicaDifferencesJson(w.key("replica_differences"), p.replicaDifferences);
    writeNonFiniteJson(w.key("problems").strings(p.problems).key("non_finite"), p.nonFinite);
    w.endObject();
}

void writeAggregate(JsonWriter& w, const AggregateBc& a)
{
    const std::size_t layers = a.layers.size(), g = std::size_t(a.generationCount);
    w.beginObject()
        .key("prompt_ids")
        .strings(a.promptIds)
        .key("layer_names")
        .strings(a.layers)
        .field("num_generation_indices", a.generationCount)
        .key("divergence_counts")
        .numbers(a.divergenceCounts);
    writeLayerRows(w.key("k_bc"), a.bc[0].data(), layers, g);
    writeLayerRows(w.key("v_bc"), a.bc[1].data(), layers, g);
    w.key("combined_k_bc").floats(a.combined[0].data(), layers);
    w.key("combined_v_bc").floats(a.combined[1].data(), layers);
    writeLayerRows(w.key("k_bc_vs_noise"), a.bcVsNoise[0].data(), layers, g);
    writeLayerRows(w.key("v_bc_vs_noise"), a.bcVsNoise[1].data(), layers, g);
    w.key("combined_k_bc_vs_noise").floats(a.combinedVsNoise[0].data(), layers);
    w.key("combined_v_bc_vs_noise").floats(a.combinedVsNoise[1].data(), layers);
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
        .endObject()
        .key("problems")
        .strings(result.problems)
        .key("not_compared")
        .array(result.notCompared.size(), [&](std::size_t i) {
            w.beginObject()
                .field("layer", result.notCompared[i].first)
                .field("what", result.notCompared[i].second)
                .endObject();
        });
    writeSuspectsJson(w.key("suspects"), result.suspects);
    w.key("prompts").array(result.prompts.size(), [&](std::size_t i) { writePrompt(w, result.prompts[i]); });
    w.key("aggregate");
    if (result.aggregate)
        writeAggregate(w, *result.aggregate);
    else
        w.null();
    w.endObject();
    out << '\n';
}

}  // namespace kvscope
