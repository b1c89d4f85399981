// The analysis as strict JSON: complete, no NaN, nulls where there is no data; and its fields
// those of a results file's record, read back by one reader to what the analysis had.

#include "analysis/analysis_fields.h"
#include "analysis/analysis_json.h"
#include "analysis/analyzer.h"
#include "results/analysis_record.h"
#include "util/json_writer.h"
#include "metric_reference.h"
#include "test_support.h"

#include <nlohmann/json.hpp>

#include <QTemporaryDir>
#include <QTest>

#include <algorithm>
#include <cmath>
#include <limits>
#include <sstream>

using namespace kvscope;
using namespace kvtest;

class TestAnalysisJson : public QObject {
    Q_OBJECT

private slots:
    void initTestCase();
    void jsonIsStrictAndComplete();
    void infinitiesAreNullToo();
    void recordSharesTheJsonFields_data();
    void recordSharesTheJsonFields();

private:
    QTemporaryDir m_dir;
    std::string m_demo;
};

void TestAnalysisJson::initTestCase()
{
    m_demo = m_dir.filePath("demo.h5").toStdString();
    writeSmallCapture(m_demo);
}

void TestAnalysisJson::jsonIsStrictAndComplete()
{
    auto reader = std::make_shared<BundleReader>(m_demo);
    const AnalysisResult result = analyzeBundle(reader);
    std::ostringstream text;
    writeAnalysisJson(result, text);
    QVERIFY(text.str().find("NaN") == std::string::npos);
    QVERIFY(text.str().find("nan") == std::string::npos);
    const nlohmann::json j = nlohmann::json::parse(text.str());  // strict: throws on NaN, Infinity
    QCOMPARE(j["format"].get<std::string>(), std::string("kvscope-analysis"));
    QCOMPARE(j["prompts"].size(), std::size_t(3));
    const auto& p = j["prompts"][1];
    const PromptAnalysis& r = result.prompts[1];
    QCOMPARE(p["prompt_len"].get<std::int64_t>(), r.promptLen);
    QCOMPARE(p["num_tokens"].get<std::int64_t>(), r.tokens);
    QCOMPARE(p["num_heads"].get<int>(), r.heads);
    QCOMPARE(p["layer_names"].get<std::vector<std::string>>(), r.layers);
    QCOMPARE(p["divergence_positions"].get<std::vector<std::int64_t>>(), std::vector<std::int64_t>{31 + 4});
    for (const char* name : {"k_cos", "v_cos", "k_linf", "v_linf", "k_l2", "v_l2", "base_k_linf", "base_v_linf",
                             "base_k_l2", "base_v_l2"}) {
        const auto& m = p["metrics"][name];
        QCOMPARE(m.size(), r.layers.size());
        QCOMPARE(m[0].size(), std::size_t(r.tokens));
        QCOMPARE(m[0][0].size(), std::size_t(r.heads));
    }
    int nulls = 0;
    for (std::size_t l = 0; l < r.layers.size(); ++l)
        for (std::int64_t t = 0; t < r.tokens; ++t)
            for (int h = 0; h < r.heads; ++h) {
                const auto& cell = p["metrics"]["k_linf"][l][std::size_t(t)][std::size_t(h)];
                const float v = r.value(Metric::KLinf, int(l), t, h);
                if (std::isnan(v)) {
                    QVERIFY(cell.is_null());
                    ++nulls;
                } else {
                    QCOMPARE(cell.get<float>(), v);  // shortest round-trip form is exact
                }
            }
    QVERIFY(nulls > 0);  // sliding-window layers and the last position have no data
    QCOMPARE(p["bc"]["k_bc"].size(), r.layers.size());
    QVERIFY(p["bc"]["k_bc"][0][0].is_null());  // outside the window
    const auto& a = j["aggregate"];
    QCOMPARE(a["num_generation_indices"].get<int>(), 12);
    QCOMPARE(a["combined_v_bc"].size(), r.layers.size());
    QCOMPARE(a["combined_k_bc_vs_noise"].size(), r.layers.size());
    QCOMPARE(a["v_bc_vs_noise"][2].size(), std::size_t(12));
    QCOMPARE(p["bc_vs_noise"]["v"].size(), r.layers.size());
    QCOMPARE(p["bc_vs_noise"]["k"][0].size(), std::size_t(r.tokens));
    QVERIFY(p["bc_vs_noise"]["k"][0][0].is_null());  // outside the window: no data
    QCOMPARE(a["k_bc"][2].size(), std::size_t(12));
}

void TestAnalysisJson::infinitiesAreNullToo()
{
    AnalysisResult result = analyzeBundle(std::make_shared<BundleReader>(m_demo));
    PromptAnalysis& p = result.prompts.front();
    const float inf = std::numeric_limits<float>::infinity();
    p.metrics[std::size_t(Metric::KLinf)][0] = inf;
    p.metrics[std::size_t(Metric::KLinf)][1] = -inf;
    p.bc[0][0] = inf;
    Divergence d;
    d.position = 3;
    d.logitGap = std::numeric_limits<double>::infinity();
    d.ulpBound = std::nan("");
    p.divergences.push_back(d);
    if (result.aggregate)
        result.aggregate->combined[0][0] = -inf;
    std::ostringstream text;
    writeAnalysisJson(result, text);
    const nlohmann::json j = nlohmann::json::parse(text.str());  // strict
    const nlohmann::json& first = j["prompts"][0];
    QVERIFY(first["metrics"]["k_linf"][0][0][0].is_null());
    QVERIFY(first["metrics"]["k_linf"][0][0][1].is_null());
    QVERIFY(first["bc"]["k_bc"][0][0].is_null());
    QVERIFY(first["divergences"].back()["logit_gap"].is_null());
    QVERIFY(first["divergences"].back()["ulp_bound"].is_null());
    if (result.aggregate)
        QVERIFY(j["aggregate"]["combined_k_bc"][0].is_null());
}

namespace {

using Json = JsonFields::Json;

Suspect handMadeSuspect()
{
    Suspect s;
    s.pattern = SuspectPattern::Block;
    s.score = 12.375;
    Hypothesis h;
    h.kind = "scale";
    h.parameters = {{"factor", 1.25}, {"offset", -3}};
    h.text = "K is 1.25x the reference";
    h.residualFloors = 0.5;
    h.errorFloors = 12.375;
    h.explainedShare = 0.75;
    s.hypothesis = h;
    s.tried = {h, Hypothesis{}};  // (one that could not be tested: null)
    ErrorShape m;  // (an explained suspect has none: hand-made, both at once)
    m.directionKept = true;
    m.directionFloors = 0.75;
    m.oneMinusCos = 0.0078125;
    m.sizeOff = true;
    m.sizeFloors = 40.5;
    m.sizeMin = 0.375;
    m.sizeMax = 1.625;
    m.variesAlong = {"token", "channel"};
    m.shares = {{"token", 0.875}, {"block_position", std::nan("")}, {"channel", 0.5}};
    m.parts = {"k"};
    m.cells = 48;
    m.text = "direction kept; size off by a factor of 0.38-1.6x, varying by token; K only";
    s.measured = m;
    s.evidence = "K of head 1 of model.layers.5 is off at tokens 2-3";
    s.evidencePrompt = "p\"0";
    s.prompts = {"p\"0", "p1"};
    s.firstLayer = "model.layers.5.attn";
    s.layers = {"model.layers.5.attn", "model.layers.0.attn"};
    s.kv = "k";
    s.sharedBlock = 9;
    s.sharedBy = {"p1"};
    s.heads = {1, 3};
    s.tpRanks = {0};
    s.dcpRanks = {1};
    s.firstToken = 2;
    s.lastToken = 3;
    s.phase = "decode";
    s.blocks = {{0, 1, 7}, {2, 4, -1}};
    s.structure = StructuralFinding{"chunk_boundary", {{"chunk", 1}, {"boundary", 12}, {"chance", 0.0625}},
                                    "The error steps at position 12, the first of prefill chunk 1"};
    s.worstLayer = 1;
    s.worstToken = 3;
    s.worstHead = 1;
    s.worstPart = KvPart::V;
    return s;
}

// Every field the analysis JSON and the record share, none left at its default.
PromptAnalysis handMadePrompt(bool threeWay)
{
    PromptAnalysis p;
    p.id = "p\"0";
    p.inputIds = {5, 0, 65535, 12, 7};
    p.referenceHashes[0] = {0x0123456789abcdefULL, 0xfedcba9876543210ULL};
    // What an analysis holds for a two-way prompt's baseline: 0 (it has none).
    p.referenceHashes[1] = threeWay ? std::vector<std::uint64_t>{1, ~0ULL} : std::vector<std::uint64_t>{0, 0};
    p.promptLen = 3;
    p.tokens = 5;
    p.heads = 4;
    p.layerHeads = {4, 2};
    p.dims = HeadDims(64, 32);
    p.layerDims = {HeadDims(64, 32), HeadDims(128)};
    p.partNames = {"c_kv", "k_pe"};
    p.threeWay = threeWay;
    p.layers = {"model.layers.0.attn", "model.layers.5.attn"};
    p.layerGroups = {0, 2};
    p.layerDtypes = {DType::BFloat16, DType::Float8E4M3};
    // Positions 0-1 from the prefix cache (blocks 17), 2 loaded by a connector, 3-4 decode steps.
    p.provenance = parseProvenance(R"([{"start": 0, "end": 2, "kind": "prefix_cache", "blocks": [17]},
        {"start": 2, "end": 3, "kind": "external", "connector": "Nixl\"Connector"},
        {"start": 3, "end": 4, "kind": "decode", "step": 0}, {"start": 4, "end": 5, "kind": "decode", "step": 1}])",
                                   5);
    p.allocate();  // (the JSON writes the arrays too; allocate forgets the scales)
    p.cacheScales[1].granularity = ScaleGranularity::Head;
    p.cacheScales[1].heads = {std::vector<float>{0.5f, 0.25f}, std::vector<float>{1.5f, 3e-5f}};
    Divergence d;
    d.position = 4;
    d.engineToken = 17;
    d.teacherToken = 18;
    d.logitGap = 0.125;
    d.ulpBound = 0.0078125;
    d.inBounds = false;
    Divergence derived;
    derived.position = 5;
    derived.derived = true;
    p.divergences = {d, derived};
    p.nonFinite = {NonFiniteCell{1, 4, 1, KvPart::V, "expected"}};
    p.problems = {"model.layers.5.attn: a block could not be read"};
    ReplicaDifference r;
    r.layer = "model.layers.5.attn";
    r.snapshot = 1;
    r.rank = 1;
    r.againstRank = 0;
    r.part = "k_pe";
    r.physicalBlock = 7;
    r.logicalBlock = 3;
    r.firstPosition = 24;
    r.lastPosition = 31;
    r.blocks = 2;
    p.replicaDifferences = {r};
    p.suspects = {handMadeSuspect()};
    return p;
}

AnalysisResult handMadeResult(bool threeWay)
{
    AnalysisResult result;
    result.bundle = "b.h5";
    result.prompts.push_back(handMadePrompt(threeWay));
    result.problems = {"prompt q: could not be analysed"};
    result.notCompared = {{"model.layers.1.mamba", "state-space layers"}};
    result.suspects = {handMadeSuspect()};
    if (!threeWay)
        return result;  // (the aggregate pools three-way prompts)
    const float nan = std::nanf("");
    AggregateBc& a = result.aggregate.emplace();
    a.promptIds = {"p\"0"};
    a.layers = result.prompts.front().layers;
    a.generationCount = 2;
    a.divergenceCounts = {0, 1};
    a.bc = {std::vector<float>{0.5f, nan, 0.25f, 1.0f}, std::vector<float>{0.75f, 0.875f, 0.9375f, 1e-7f}};
    a.combined = {std::vector<float>{0.96875f, nan}, std::vector<float>{0.5f, 0.125f}};
    a.bcVsNoise = {std::vector<float>{0.1f, 0.2f, 0.3f, 0.4f}, std::vector<float>{nan, nan, 0.7f, 0.8f}};
    a.combinedVsNoise = {std::vector<float>{0.0625f, 1.0f}, std::vector<float>{0.03125f, nan}};
    return result;
}

bool sameFloats(const std::vector<float>& a, const std::vector<float>& b)
{
    if (a.size() != b.size())
        return false;
    for (std::size_t i = 0; i < a.size(); ++i)
        if (!(a[i] == b[i] || (std::isnan(a[i]) && std::isnan(b[i]))))
            return false;
    return true;
}

void compareHypothesis(const Hypothesis& got, const Hypothesis& want)
{
    QCOMPARE(got.kind, want.kind);
    QVERIFY(got.parameters == want.parameters);
    QCOMPARE(got.text, want.text);
    QCOMPARE(got.residualFloors, want.residualFloors);
    QCOMPARE(got.errorFloors, want.errorFloors);
    QCOMPARE(got.explainedShare, want.explainedShare);
}

void compareSuspects(const std::vector<Suspect>& got, const std::vector<Suspect>& want)
{
    QCOMPARE(got.size(), want.size());
    for (std::size_t i = 0; i < want.size(); ++i) {
        const Suspect &g = got[i], &w = want[i];
        QCOMPARE(int(g.pattern), int(w.pattern));
        QCOMPARE(g.score, w.score);
        compareHypothesis(g.hypothesis, w.hypothesis);
        QCOMPARE(g.tried.size(), w.tried.size());
        for (std::size_t h = 0; h < w.tried.size(); ++h)
            compareHypothesis(g.tried[h], w.tried[h]);
        QCOMPARE(g.measured.has_value(), w.measured.has_value());
        if (w.measured) {
            const ErrorShape &gm = *g.measured, &wm = *w.measured;
            QVERIFY(gm.directionKept == wm.directionKept && gm.sizeOff == wm.sizeOff);
            QVERIFY(gm.directionFloors == wm.directionFloors && gm.oneMinusCos == wm.oneMinusCos &&
                    gm.sizeFloors == wm.sizeFloors && gm.sizeMin == wm.sizeMin && gm.sizeMax == wm.sizeMax);
            QCOMPARE(gm.variesAlong, wm.variesAlong);
            QCOMPARE(gm.shares.size(), wm.shares.size());
            for (std::size_t a = 0; a < wm.shares.size(); ++a)
                QVERIFY(gm.shares[a].first == wm.shares[a].first &&
                        (gm.shares[a].second == wm.shares[a].second ||
                         (std::isnan(gm.shares[a].second) && std::isnan(wm.shares[a].second))));
            QCOMPARE(gm.parts, wm.parts);
            QCOMPARE(gm.cells, wm.cells);
            QCOMPARE(gm.text, wm.text);
        }
        QCOMPARE(g.structure.has_value(), w.structure.has_value());
        if (w.structure) {
            QCOMPARE(g.structure->kind, w.structure->kind);
            QCOMPARE(g.structure->text, w.structure->text);
            QCOMPARE(g.structure->parameters.size(), w.structure->parameters.size());
            for (const auto& [name, value] : w.structure->parameters)
                QCOMPARE(g.structure->parameter(name), value);
        }
        QCOMPARE(g.evidence, w.evidence);
        QCOMPARE(g.evidencePrompt, w.evidencePrompt);
        QCOMPARE(g.prompts, w.prompts);
        QCOMPARE(g.firstLayer, w.firstLayer);
        QCOMPARE(g.layers, w.layers);
        QCOMPARE(g.kv, w.kv);
        QCOMPARE(g.sharedBlock, w.sharedBlock);
        QCOMPARE(g.sharedBy, w.sharedBy);
        QCOMPARE(g.heads, w.heads);
        QCOMPARE(g.tpRanks, w.tpRanks);
        QCOMPARE(g.dcpRanks, w.dcpRanks);
        QCOMPARE(g.firstToken, w.firstToken);
        QCOMPARE(g.lastToken, w.lastToken);
        QCOMPARE(g.phase, w.phase);
        QCOMPARE(g.blocks.size(), w.blocks.size());
        for (std::size_t b = 0; b < w.blocks.size(); ++b)
            QVERIFY(g.blocks[b].group == w.blocks[b].group && g.blocks[b].logical == w.blocks[b].logical &&
                    g.blocks[b].physical == w.blocks[b].physical);
        QVERIFY(g.worstLayer == w.worstLayer && g.worstToken == w.worstToken && g.worstHead == w.worstHead &&
                g.worstPart == w.worstPart);
    }
}

void compareShape(const PromptAnalysis& got, const PromptAnalysis& want)
{
    QCOMPARE(got.id, want.id);
    QCOMPARE(got.inputIds, want.inputIds);
    QCOMPARE(got.referenceHashes[0], want.referenceHashes[0]);
    QCOMPARE(got.referenceHashes[1], want.referenceHashes[1]);
    QCOMPARE(got.threeWay, want.threeWay);
    QCOMPARE(got.promptLen, want.promptLen);
    QCOMPARE(got.tokens, want.tokens);
    QCOMPARE(got.heads, want.heads);
    QVERIFY(got.dims == want.dims);
    QVERIFY(got.layerDims == want.layerDims);
    QCOMPARE(got.layerHeads, want.layerHeads);
    QVERIFY(got.partNames == want.partNames);
    QCOMPARE(got.layers, want.layers);
    QCOMPARE(got.layerGroups, want.layerGroups);
    QVERIFY(describeProvenance(got.provenance) == describeProvenance(want.provenance));
    QVERIFY(got.provenance.front().blocks == want.provenance.front().blocks);
}

void compareFindings(const PromptAnalysis& got, const PromptAnalysis& want)
{
    QCOMPARE(got.divergences.size(), want.divergences.size());
    for (std::size_t i = 0; i < want.divergences.size(); ++i) {
        const Divergence &g = got.divergences[i], &w = want.divergences[i];
        QVERIFY(g.position == w.position && g.derived == w.derived && g.engineToken == w.engineToken &&
                g.teacherToken == w.teacherToken && g.logitGap == w.logitGap && g.ulpBound == w.ulpBound &&
                g.inBounds == w.inBounds);
    }
    QCOMPARE(got.nonFinite.size(), want.nonFinite.size());
    for (std::size_t i = 0; i < want.nonFinite.size(); ++i) {
        const NonFiniteCell &g = got.nonFinite[i], &w = want.nonFinite[i];
        QVERIFY(g.layer == w.layer && g.token == w.token && g.head == w.head && g.part == w.part && g.side == w.side);
    }
    QCOMPARE(got.problems, want.problems);
    QCOMPARE(got.replicaDifferences.size(), want.replicaDifferences.size());
    for (std::size_t i = 0; i < want.replicaDifferences.size(); ++i) {
        const ReplicaDifference &g = got.replicaDifferences[i], &w = want.replicaDifferences[i];
        QVERIFY(g.layer == w.layer && g.snapshot == w.snapshot && g.rank == w.rank && g.againstRank == w.againstRank &&
                g.part == w.part && g.physicalBlock == w.physicalBlock && g.logicalBlock == w.logicalBlock &&
                g.firstPosition == w.firstPosition && g.lastPosition == w.lastPosition && g.blocks == w.blocks);
    }
    compareSuspects(got.suspects, want.suspects);
}

void compareDocument(const AnalysisResult& got, const AnalysisResult& want)
{
    QCOMPARE(got.problems, want.problems);
    QVERIFY(got.notCompared == want.notCompared);
    compareSuspects(got.suspects, want.suspects);
}

void compareAggregate(const AggregateBc& got, const AggregateBc& want, bool perGeneration)
{
    QCOMPARE(got.promptIds, want.promptIds);
    QCOMPARE(got.layers, want.layers);
    QCOMPARE(got.generationCount, want.generationCount);
    QCOMPARE(got.divergenceCounts, want.divergenceCounts);
    for (std::size_t part = 0; part < 2; ++part) {
        QVERIFY(sameFloats(got.combined[part], want.combined[part]));
        QVERIFY(sameFloats(got.combinedVsNoise[part], want.combinedVsNoise[part]));
        QVERIFY(!perGeneration || sameFloats(got.bc[part], want.bc[part]));
        QVERIFY(!perGeneration || sameFloats(got.bcVsNoise[part], want.bcVsNoise[part]));
    }
}

// Each key of `record` but the record's own is in `json`, with the same value.
void compareKeys(const Json& record, const Json& json, const std::vector<std::string>& own)
{
    for (const auto& [key, value] : record.items()) {
        if (std::find(own.begin(), own.end(), key) != own.end())
            continue;
        QVERIFY2(json.contains(key), key.c_str());
        QVERIFY2(json.at(key) == value, key.c_str());
    }
}

}  // namespace

void TestAnalysisJson::recordSharesTheJsonFields_data()
{
    QTest::addColumn<bool>("threeWay");
    QTest::newRow("three-way") << true;
    QTest::newRow("two-way") << false;
}

// The analysis JSON and a results file's record cannot drift apart: what each writes is read
// back, by the one reader, to what the test made, and the record's shared keys are the JSON's.
void TestAnalysisJson::recordSharesTheJsonFields()
{
    QFETCH(bool, threeWay);
    const AnalysisResult made = handMadeResult(threeWay);
    const PromptAnalysis& want = made.prompts.front();
    std::ostringstream jsonText, recordText;
    writeAnalysisJson(made, jsonText);
    JsonWriter w(recordText);
    writeAnalysisRecord(w, made, RecordedOptions{});
    const Json json = Json::parse(jsonText.str()), record = Json::parse(recordText.str());
    const JsonFields f("made");

    PromptAnalysis fromJson;
    const Json& prompt = json.at("prompts").at(0);
    readPromptShape(f, prompt, "prompts[0].", fromJson);
    readPromptDivergences(f, prompt, "prompts[0].", fromJson);
    readPromptFindings(f, prompt, "prompts[0].", fromJson);
    compareShape(fromJson, want);
    compareFindings(fromJson, want);
    AnalysisResult jsonDocument;
    readDocumentFindings(f, json, jsonDocument);
    compareDocument(jsonDocument, made);
    QCOMPARE(json.at("aggregate").is_null(), !threeWay);
    if (threeWay)
        compareAggregate(*readAggregateFields(f, json, AggregateRows::WithPerGeneration), *made.aggregate, true);

    RecordedOptions options;
    const AnalysisResult fromRecord = readAnalysisRecord(f, record, options);
    QCOMPARE(fromRecord.prompts.size(), std::size_t(1));
    compareShape(fromRecord.prompts.front(), want);
    compareFindings(fromRecord.prompts.front(), want);
    QCOMPARE(fromRecord.prompts.front().layerDtypes, want.layerDtypes);
    QCOMPARE(int(fromRecord.prompts.front().cacheScales[1].granularity), int(ScaleGranularity::Head));
    QCOMPARE(fromRecord.prompts.front().cacheScales[1].heads[1], want.cacheScales[1].heads[1]);
    compareDocument(fromRecord, made);
    QCOMPARE(fromRecord.aggregate.has_value(), threeWay);
    if (threeWay)
        compareAggregate(*fromRecord.aggregate, *made.aggregate, false);

    // The JSON splits the prompt by source; a record does not keep what it can compute again.
    const Json& sources = prompt.at("sources");
    QCOMPARE(sources.size(), std::size_t(3));
    QCOMPARE(sources.at(1).at("source").get<std::string>(), std::string("external (Nixl\"Connector)"));
    QVERIFY(sources.at(2).at("spans") == Json::parse("[[3, 5]]"));
    QCOMPARE(sources.at(2).at("positions").get<int>(), 2);
    QVERIFY(!record.at("prompts").at(0).contains("sources"));

    compareKeys(record, json, {"options", "prompts", "aggregate"});
    compareKeys(record.at("prompts").at(0), prompt, {"layer_dtypes", "cache_scales"});
    if (threeWay)
        compareKeys(record.at("aggregate"), json.at("aggregate"), {});
}

QTEST_APPLESS_MAIN(TestAnalysisJson)
#include "tst_analysis_json.moc"
