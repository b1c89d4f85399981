#include "analysis/analysis_fields.h"

#include "analysis/impact_json.h"
#include "util/content_hash.h"
#include "util/json_writer.h"

#include <cmath>
#include <limits>
#include <stdexcept>

namespace kvscope {

namespace {

using Json = JsonFields::Json;

const SuspectPattern kPatterns[] = {SuspectPattern::NonFinite,  SuspectPattern::Block,      SuspectPattern::TpRank,
                                    SuspectPattern::Head,       SuspectPattern::Position,   SuspectPattern::WindowEdge,
                                    SuspectPattern::Layer,      SuspectPattern::Unexplained, SuspectPattern::State};

std::string item(const std::string& where, const char* key, std::size_t i)
{
    return where + key + "[" + std::to_string(i) + "]";
}

// Each item of the array `key` of `j`, read by `read(f, item, "where.key[i].")`.
template <typename T, typename Read>
std::vector<T> readEach(const JsonFields& f, const Json& j, const char* key, const std::string& where, Read read)
{
    std::vector<T> out;
    const Json& list = f.array(j, key, where);
    for (std::size_t i = 0; i < list.size(); ++i)
        out.push_back(read(f, list[i], item(where, key, i) + "."));
    return out;
}

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

// An integer of `j` that must lie in [0, most].
std::int64_t boundedInteger(const JsonFields& f, const Json& j, const char* key, const std::string& where, std::int64_t most)
{
    const std::int64_t v = f.integer(j, key, where);
    if (v < 0 || v > most)
        f.fail(where + key, "is " + std::to_string(v) + ", outside 0.." + std::to_string(most));
    return v;
}

void writeFingerprints(JsonWriter& w, const std::vector<std::uint64_t>& hashes)
{
    w.array(hashes.size(), [&](std::size_t l) { w.value(hexFingerprint(hashes[l])); });
}

// --- the prompt's shape ------------------------------------------------------------------

// One fingerprint per layer; a two-way prompt's baseline is null (it has none), read as 0s.
void readFingerprints(const JsonFields& f, const Json& j, const std::string& where, PromptAnalysis& p)
{
    const std::string at = where + "reference_fingerprints.";
    const Json& both = f.at(j, "reference_fingerprints", where);
    if (!both.is_object())
        f.fail(where + "reference_fingerprints", "must be {expected, baseline}");
    for (std::size_t role = 0; role < 2; ++role) {
        const char* name = role ? "baseline" : "expected";
        const Json& list = f.at(both, name, at);
        if (list.is_null() && role == 1 && !p.threeWay) {
            p.referenceHashes[role].assign(p.layers.size(), 0);
            continue;
        }
        if (!list.is_array() || list.size() != p.layers.size())
            f.fail(at + name, "must hold one fingerprint per layer (" + std::to_string(p.layers.size()) + ")");
        for (std::size_t l = 0; l < list.size(); ++l)
            p.referenceHashes[role].push_back(f.fingerprint(list[l], item(at, name, l)));
    }
}

std::vector<HeadDims> readLayerHeadDims(const JsonFields& f, const Json& j, const std::string& where)
{
    std::vector<HeadDims> out;
    const Json& list = f.array(j, "layer_head_dims", where);
    for (std::size_t l = 0; l < list.size(); ++l) {
        const Json& d = list[l];
        if (!d.is_array() || d.size() != 2 || !d[0].is_number_integer() || !d[1].is_number_integer())
            f.fail(item(where, "layer_head_dims", l), "must be [k, v]");
        HeadDims dims;
        dims.k = d[0].get<int>();
        dims.v = d[1].get<int>();
        out.push_back(dims);
    }
    return out;
}

// --- the findings ------------------------------------------------------------------------

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
    w.endObject();
    if (!h.labels.empty()) {  // absent otherwise: the JSON of kinds without names is as before
        w.key("labels").beginObject();
        for (const auto& [name, value] : h.labels)
            w.field(name, value);
        w.endObject();
    }
    w.field("text", h.text)
        .field("residual_floors", h.residualFloors)
        .field("error_floors", h.errorFloors)
        .field("explained_share", h.explainedShare)
        .endObject();
}

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
    if (h.contains("labels")) {
        const Json& labels = h.at("labels");
        if (!labels.is_object())
            f.fail(where + "labels", "must be an object");
        for (const auto& [name, value] : labels.items()) {
            if (!value.is_string())
                f.fail(where + "labels." + name, "must be a string");
            out.labels.emplace_back(name, value.get<std::string>());
        }
    }
    out.text = f.text(h, "text", where);
    out.residualFloors = f.number(h, "residual_floors", where);
    out.errorFloors = f.number(h, "error_floors", where);
    out.explainedShare = f.number(h, "explained_share", where);
    return out;
}

// What an unexplained suspect's error looks like; absent for an explained one (so that an
// explained suspect's JSON is the one kvscope wrote before `measured` existed).
void writeMeasured(JsonWriter& w, const std::optional<ErrorShape>& m)
{
    if (!m)
        return;
    w.key("measured")
        .beginObject()
        .field("direction_kept", m->directionKept)
        .field("direction_floors", m->directionFloors)
        .field("one_minus_cos", m->oneMinusCos)
        .field("size_off", m->sizeOff)
        .field("size_floors", m->sizeFloors)
        .key("size_factor")
        .beginArray()
        .value(m->sizeMin)
        .value(m->sizeMax)
        .endArray()
        .key("varies_along")
        .strings(m->variesAlong)
        .key("shares")
        .beginObject();
    for (const auto& [axis, share] : m->shares)
        w.field(axis, share);
    w.endObject().key("parts").strings(m->parts).field("cells", m->cells).field("text", m->text).endObject();
}

// Absent (an analysis JSON written before it) or null: none.
std::optional<ErrorShape> readMeasured(const JsonFields& f, const Json& j, const std::string& at)
{
    if (!j.contains("measured") || j.at("measured").is_null())
        return std::nullopt;
    const Json& m = j.at("measured");
    const std::string where = at + "measured.";
    ErrorShape out;
    out.directionKept = f.boolean(m, "direction_kept", where);
    out.directionFloors = f.number(m, "direction_floors", where);
    out.oneMinusCos = f.number(m, "one_minus_cos", where);
    out.sizeOff = f.boolean(m, "size_off", where);
    out.sizeFloors = f.number(m, "size_floors", where);
    const Json& factor = f.array(m, "size_factor", where);
    if (factor.size() != 2)
        f.fail(where + "size_factor", "must be [min, max]");
    out.sizeMin = factor[0].is_number() ? factor[0].get<double>() : std::nan("");
    out.sizeMax = factor[1].is_number() ? factor[1].get<double>() : std::nan("");
    out.variesAlong = f.texts(m, "varies_along", where);
    const Json& shares = f.at(m, "shares", where);
    if (!shares.is_object())
        f.fail(where + "shares", "must be an object");
    for (const auto& [axis, value] : shares.items())
        out.shares.emplace_back(axis, value.is_number() ? value.get<double>() : std::nan(""));
    out.parts = f.texts(m, "parts", where);
    out.cells = int(f.integer(m, "cells", where));
    out.text = f.text(m, "text", where);
    return out;
}

// Where a suspect is: its tokens, shared block, phase, blocks and worst cell.
void writeSuspectPlace(JsonWriter& w, const Suspect& s)
{
    w.key("tokens");
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
        .endObject();
}

void readSuspectPlace(const JsonFields& f, const Json& j, const std::string& at, Suspect& s)
{
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
        const std::string bt = item(at, "blocks", b) + ".";
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
}

// Only where the bundle records the paths and the off positions are one's: the JSON of a
// bundle without provenance is what it was before the field existed.
void writeProvenance(JsonWriter& w, const std::optional<ProvenanceMatch>& m)
{
    if (!m)
        return;
    w.key("provenance")
        .beginObject()
        .field("kind", provenanceKindName(m->kind))
        .field("connector", m->connector)
        .key("blocks")
        .numbers(m->blocks)
        .key("chunks")
        .numbers(m->chunks)
        .key("positions")
        .beginArray()
        .value(m->firstOff)
        .value(m->lastOff)
        .endArray()
        .field("text", m->text)
        .endObject();
}

std::optional<ProvenanceMatch> readProvenance(const JsonFields& f, const Json& j, const std::string& at)
{
    if (!j.contains("provenance") || j.at("provenance").is_null())
        return std::nullopt;
    const Json& p = j.at("provenance");
    const std::string where = at + "provenance.";
    ProvenanceMatch m;
    const std::string kind = f.text(p, "kind", where);
    const std::optional<ProvenanceKind> known = provenanceKindNamed(kind);
    if (!known)
        f.fail(where + "kind", "'" + kind + "' is not a provenance kind");
    m.kind = *known;
    m.connector = f.text(p, "connector", where);
    m.blocks = f.integers(p, "blocks", where);
    m.chunks = f.integers(p, "chunks", where);
    const std::vector<std::int64_t> positions = f.integers(p, "positions", where);
    if (positions.size() != 2)
        f.fail(where + "positions", "must be [first, last]");
    m.firstOff = positions[0];
    m.lastOff = positions[1];
    m.text = f.text(p, "text", where);
    return m;
}

// Only where a structure accounts for the off positions (structural_evidence.h): the JSON of a
// suspect without one is what it was before the field existed.
void writeStructure(JsonWriter& w, const std::optional<StructuralFinding>& s)
{
    if (!s)
        return;
    w.key("structure").beginObject().field("kind", s->kind).key("parameters").beginObject();
    for (const auto& [name, value] : s->parameters)
        w.field(name, value);
    w.endObject().field("text", s->text).endObject();
}

std::optional<StructuralFinding> readStructure(const JsonFields& f, const Json& j, const std::string& at)
{
    if (!j.contains("structure") || j.at("structure").is_null())
        return std::nullopt;
    const Json& s = j.at("structure");
    const std::string where = at + "structure.";
    StructuralFinding out;
    out.kind = f.text(s, "kind", where);
    const Json& parameters = f.at(s, "parameters", where);
    if (!parameters.is_object())
        f.fail(where + "parameters", "must be an object");
    for (const auto& [name, value] : parameters.items()) {
        if (!value.is_number())
            f.fail(where + "parameters." + name, "must be a number");
        out.parameters.emplace_back(name, value.get<double>());
    }
    out.text = f.text(s, "text", where);
    return out;
}

Suspect readSuspect(const JsonFields& f, const Json& j, const std::string& at)
{
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
    if (s.pattern == SuspectPattern::NonFinite && std::isnan(s.score))
        s.score = std::numeric_limits<double>::infinity();  // written null: no floor measures a NaN
    s.evidence = f.text(j, "evidence", at);
    s.evidencePrompt = f.text(j, "evidence_prompt", at);
    s.hypothesis = readHypothesis(f, f.at(j, "hypothesis", at), at + "hypothesis.");
    const Json& tried = f.array(j, "tried", at);
    for (std::size_t h = 0; h < tried.size(); ++h)
        s.tried.push_back(readHypothesis(f, tried[h], item(at, "tried", h) + "."));
    s.measured = readMeasured(f, j, at);
    s.prompts = f.texts(j, "prompts", at);
    s.firstLayer = f.text(j, "first_layer", at);
    s.layers = f.texts(j, "layers", at);
    s.kv = f.text(j, "kv", at);
    s.heads = f.ints(j, "heads", at);
    s.tpRanks = f.ints(j, "tp_ranks", at);
    s.dcpRanks = f.ints(j, "dcp_ranks", at);
    readSuspectPlace(f, j, at, s);
    s.provenance = readProvenance(f, j, at);
    s.structure = readStructure(f, j, at);
    s.impact = readSuspectImpact(f, j, at);
    return s;
}

std::vector<Suspect> readSuspects(const JsonFields& f, const Json& j, const std::string& where)
{
    return readEach<Suspect>(f, j, "suspects", where, readSuspect);
}

void writeDivergences(JsonWriter& w, const std::vector<Divergence>& divergences)
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

Divergence readDivergence(const JsonFields& f, const Json& d, const std::string& at)
{
    Divergence div;
    div.position = f.integer(d, "position", at);
    div.derived = f.boolean(d, "derived", at);
    div.engineToken = optionalInteger(f, d, "engine_token", at);
    div.teacherToken = optionalInteger(f, d, "teacher_token", at);
    div.logitGap = optionalNumber(f, d, "logit_gap", at);
    div.ulpBound = optionalNumber(f, d, "ulp_bound", at);
    if (!f.at(d, "in_bounds", at).is_null())
        div.inBounds = f.boolean(d, "in_bounds", at);
    return div;
}

void writeNonFinite(JsonWriter& w, const std::vector<NonFiniteCell>& cells)
{
    w.array(cells.size(), [&](std::size_t i) {
        const NonFiniteCell& c = cells[i];
        w.beginObject()
            .field("layer", c.layer)
            .field("token", c.token)
            .field("head", c.head)
            .field("part", kvPartName(c.part))
            .field("side", c.side)
            .field("value", c.value)
            .endObject();
    });
}

NonFiniteCell readNonFiniteCell(const JsonFields& f, const Json& c, const std::string& at)
{
    NonFiniteCell cell;
    cell.layer = int(f.integer(c, "layer", at));
    cell.token = f.integer(c, "token", at);
    cell.head = int(f.integer(c, "head", at));
    cell.part = partNamed(f, f.text(c, "part", at), at + "part");
    cell.side = f.text(c, "side", at);
    if (c.contains("value"))  // (written since kvscope said NaN from infinity)
        cell.value = f.text(c, "value", at);
    return cell;
}

void writeReplicaDifferences(JsonWriter& w, const std::vector<ReplicaDifference>& differences)
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
            .field("blocks", d.blocks);
        if (d.head >= 0)  // replicated heads: the head both copies should hold
            w.field("head", d.head);
        if (d.copyHoldsHead >= 0 || d.readHoldsHead >= 0)  // a copy holding another head's KV
            w.key("holds_other_head")
                .beginObject()
                .field("rank", d.copyHoldsHead >= 0 ? d.rank : d.againstRank)
                .field("head", d.copyHoldsHead >= 0 ? d.copyHoldsHead : d.readHoldsHead)
                .field("equals_rank", d.holdsFrom)
                .endObject();
        w.field("text", d.describe())  // (for readers of the JSON: made again from the rest)
            .endObject();
    });
}

ReplicaDifference readReplicaDifference(const JsonFields& f, const Json& r, const std::string& at)
{
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
    if (r.contains("head"))
        d.head = int(f.integer(r, "head", at));
    if (r.contains("holds_other_head")) {
        const Json& o = r.at("holds_other_head");
        const std::string in = at + "holds_other_head.";
        const int rank = int(f.integer(o, "rank", in)), head = int(f.integer(o, "head", in));
        if (rank != d.rank && rank != d.againstRank)
            f.fail(in + "rank", "must be rank or against_rank");
        if (d.head < 0 || head == d.head)
            f.fail(in + "head", "must be another head than `head`");
        (rank == d.rank ? d.copyHoldsHead : d.readHoldsHead) = head;
        d.holdsFrom = int(f.integer(o, "equals_rank", in));
    }
    return d;
}

// --- the aggregate -----------------------------------------------------------------------

struct AggregateBcOf {
    const char* name;  // "bc": k_bc, combined_k_bc, ...
    std::array<std::vector<float>, 2> AggregateBc::*perGeneration;
    std::array<std::vector<float>, 2> AggregateBc::*combined;
};
const AggregateBcOf kAggregateBcs[] = {{"bc", &AggregateBc::bc, &AggregateBc::combined},
                                       {"bc_vs_noise", &AggregateBc::bcVsNoise, &AggregateBc::combinedVsNoise}};

// A prompt's provenance ranges, as the bundle's attribute writes them (format/provenance.h).
void writeProvenanceRanges(JsonWriter& w, const std::vector<ProvenanceRange>& ranges)
{
    w.array(ranges.size(), [&](std::size_t i) {
        const ProvenanceRange& r = ranges[i];
        w.beginObject().field("start", r.start).field("end", r.end).field("kind", provenanceKindName(r.kind));
        if (r.chunk)
            w.field("chunk", *r.chunk);
        if (!r.blocks.empty())
            w.key("blocks").numbers(r.blocks);
        if (!r.connector.empty())
            w.field("connector", r.connector);
        if (r.step)
            w.field("step", *r.step);
        if (r.preemption)
            w.field("preemption", *r.preemption);
        w.endObject();
    });
}

std::string partKey(const char* prefix, KvPart part, const char* name)
{
    return std::string(prefix) + kvPartName(part) + "_" + name;  // "k_bc", "combined_v_bc_vs_noise"
}

}  // namespace

void writePromptShape(JsonWriter& w, const PromptAnalysis& p)
{
    w.field("id", p.id).key("input_ids").numbers(p.inputIds).key("reference_fingerprints").beginObject();
    writeFingerprints(w.key("expected"), p.referenceHashes[0]);
    w.key("baseline");
    if (p.threeWay)
        writeFingerprints(w, p.referenceHashes[1]);
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
        .numbers(p.layerGroups);
    if (!p.provenance.empty())  // (absent without: a bundle without provenance reads as before)
        writeProvenanceRanges(w.key("provenance"), p.provenance);
}

void readPromptShape(const JsonFields& f, const Json& j, const std::string& where, PromptAnalysis& p)
{
    p.id = f.text(j, "id", where);
    p.inputIds = f.integers(j, "input_ids", where);
    const std::string mode = f.text(j, "mode", where);
    if (mode != "three-way" && mode != "two-way")
        f.fail(where + "mode", "is '" + mode + "', not three-way or two-way");
    p.threeWay = mode == "three-way";
    p.promptLen = f.integer(j, "prompt_len", where);
    p.tokens = boundedInteger(f, j, "num_tokens", where, std::int64_t(1) << 24);
    p.heads = int(boundedInteger(f, j, "num_heads", where, 4096));
    p.dims.k = int(boundedInteger(f, j, "head_dim", where, INT32_MAX));
    p.dims.v = int(boundedInteger(f, j, "v_head_dim", where, INT32_MAX));
    p.layerDims = readLayerHeadDims(f, j, where);
    p.layerHeads = f.ints(j, "layer_heads", where);
    const std::vector<std::string> partNames = f.texts(j, "part_names", where);
    if (partNames.size() != 2)
        f.fail(where + "part_names", "must name K and V");
    p.partNames = {partNames[0], partNames[1]};
    p.layers = f.texts(j, "layer_names", where);
    p.layerGroups = f.ints(j, "layer_groups", where);
    const std::size_t layers = p.layers.size();
    if (p.layerHeads.size() != layers || p.layerDims.size() != layers || p.layerGroups.size() != layers)
        f.fail(where + "layer_names", "layer_heads, layer_head_dims and layer_groups must have one entry per layer");
    readFingerprints(f, j, where, p);
    if (j.contains("provenance") && !j.at("provenance").is_null()) {
        try {
            p.provenance = parseProvenance(j.at("provenance").dump(), p.tokens);
        } catch (const std::invalid_argument& e) {
            f.fail(where + "provenance", e.what());
        }
    }
}

void writePromptDivergences(JsonWriter& w, const PromptAnalysis& p)
{
    writeDivergences(w.key("divergences"), p.divergences);
}

void readPromptDivergences(const JsonFields& f, const Json& j, const std::string& where, PromptAnalysis& p)
{
    p.divergences = readEach<Divergence>(f, j, "divergences", where, readDivergence);
}

void writePromptFindings(JsonWriter& w, const PromptAnalysis& p)
{
    writeSuspectsJson(w.key("suspects"), p.suspects);
    writeReplicaDifferences(w.key("replica_differences"), p.replicaDifferences);
    writeNonFinite(w.key("problems").strings(p.problems).key("non_finite"), p.nonFinite);
}

void readPromptFindings(const JsonFields& f, const Json& j, const std::string& where, PromptAnalysis& p)
{
    p.suspects = readSuspects(f, j, where);
    p.replicaDifferences = readEach<ReplicaDifference>(f, j, "replica_differences", where, readReplicaDifference);
    p.problems = f.texts(j, "problems", where);
    p.nonFinite = readEach<NonFiniteCell>(f, j, "non_finite", where, readNonFiniteCell);
}

void writeDocumentFindings(JsonWriter& w, const AnalysisResult& result)
{
    w.key("problems").strings(result.problems).key("not_compared").array(result.notCompared.size(), [&](std::size_t i) {
        w.beginObject().field("layer", result.notCompared[i].first).field("what", result.notCompared[i].second).endObject();
    });
    writeSuspectsJson(w.key("suspects"), result.suspects);
}

void readDocumentFindings(const JsonFields& f, const Json& j, AnalysisResult& result)
{
    result.problems = f.texts(j, "problems", "");
    const Json& notCompared = f.array(j, "not_compared", "");
    for (std::size_t i = 0; i < notCompared.size(); ++i) {
        const std::string at = item("", "not_compared", i) + ".";
        result.notCompared.emplace_back(f.text(notCompared[i], "layer", at), f.text(notCompared[i], "what", at));
    }
    result.suspects = readSuspects(f, j, "");
}

void writeAggregateFields(JsonWriter& w, const std::optional<AggregateBc>& aggregate, AggregateRows rows)
{
    if (!aggregate) {
        w.key("aggregate").null();
        return;
    }
    const AggregateBc& a = *aggregate;
    const std::size_t layers = a.layers.size(), g = std::size_t(a.generationCount);
    w.key("aggregate")
        .beginObject()
        .key("prompt_ids")
        .strings(a.promptIds)
        .key("layer_names")
        .strings(a.layers)
        .field("num_generation_indices", a.generationCount)
        .key("divergence_counts")
        .numbers(a.divergenceCounts);
    for (const AggregateBcOf& bc : kAggregateBcs) {
        if (rows == AggregateRows::WithPerGeneration)
            for (KvPart part : {KvPart::K, KvPart::V})
                w.key(partKey("", part, bc.name)).floatRows((a.*bc.perGeneration)[std::size_t(part)].data(), layers, g);
        for (KvPart part : {KvPart::K, KvPart::V})
            w.key(partKey("combined_", part, bc.name)).floats((a.*bc.combined)[std::size_t(part)].data(), layers);
    }
    w.endObject();
}

std::optional<AggregateBc> readAggregateFields(const JsonFields& f, const Json& j, AggregateRows rows)
{
    const Json& aggregate = f.at(j, "aggregate", "");
    if (aggregate.is_null())
        return std::nullopt;
    const std::string where = "aggregate.";
    AggregateBc a;
    a.promptIds = f.texts(aggregate, "prompt_ids", where);
    a.layers = f.texts(aggregate, "layer_names", where);
    a.generationCount = boundedInteger(f, aggregate, "num_generation_indices", where, std::int64_t(1) << 24);
    a.divergenceCounts = f.ints(aggregate, "divergence_counts", where);
    const std::size_t layers = a.layers.size();
    for (const AggregateBcOf& bc : kAggregateBcs)
        for (KvPart part : {KvPart::K, KvPart::V}) {
            if (rows == AggregateRows::WithPerGeneration) {
                const std::string key = partKey("", part, bc.name);
                (a.*bc.perGeneration)[std::size_t(part)] =
                    f.layerRows(f.at(aggregate, key.c_str(), where), layers, a.generationCount, where + key);
            }
            const std::string key = partKey("combined_", part, bc.name);
            std::vector<float>& combined = (a.*bc.combined)[std::size_t(part)];
            combined = f.floats(aggregate, key.c_str(), where);
            if (combined.size() != layers)
                f.fail(where + key, "has " + std::to_string(combined.size()) + " values for " + std::to_string(layers) + " layers");
        }
    return a;
}

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
        writeMeasured(w, s.measured);
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
            .numbers(s.dcpRanks);
        writeSuspectPlace(w, s);
        writeProvenance(w, s.provenance);
        writeStructure(w, s.structure);
        writeSuspectImpact(w, s.impact);
        w.endObject();
    });
}

}  // namespace kvscope
