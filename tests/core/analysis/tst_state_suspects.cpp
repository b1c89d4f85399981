// The recurrent state of hybrid models compared (analysis/state_analysis.h) and its suspects
// (analysis/state_suspects.h): metrics against a double-precision reference written here, cells
// of grouped conv channels, the model's layer order; each state fault of the synth named at its
// layer and checkpoint, three-way and two-way, on the tuned captures and on held-out ones (other
// seeds, shapes, TP sizes, layers and checkpoints); clean hybrids of 1,000 and 8,000 tokens with
// every layer compared and no suspect; an attention fault upstream still first; the JSON.

#include "analysis/analysis_json.h"
#include "analysis/analyzer.h"
#include "analysis/head_error_histogram.h"
#include "analysis/state_analysis.h"
#include "analysis/state_json.h"
#include "analysis/state_rows.h"
#include "analysis/state_suspects.h"
#include "format/bundle_reader.h"
#include "synth/model_capture.h"
#include "util/short_number.h"
#include "test_support.h"

#include <QTemporaryDir>
#include <QTest>

#include <nlohmann/json.hpp>

#include <cmath>
#include <sstream>

using namespace kvscope;
using namespace kvscope::synth;
using namespace kvtest;

namespace {

// Relative L2 of x against ref, in double (the reference tool's: ||ref - x|| / max(||ref||, 1e-10)).
double relL2(const std::vector<double>& ref, const std::vector<double>& x)
{
    double d = 0, n = 0;
    for (std::size_t i = 0; i < ref.size(); ++i) {
        d += (ref[i] - x[i]) * (ref[i] - x[i]);
        n += ref[i] * ref[i];
    }
    return std::sqrt(d) / std::max(std::sqrt(n), 1e-10);
}

// One part "ssm", 2 checkpoints x 3 units of 32 values, float32 on every side.
LayerState handState(bool threeWay)
{
    LayerState s;
    s.layer = "model.layers.0.mixer";
    s.kind = "mamba2";
    s.positions = {8, 16};
    s.hasBaseline = threeWay;
    StatePartValues part;
    part.name = "ssm";
    part.shape = {2, 3, 32};
    for (int i = 0; i < 2 * 3 * 32; ++i) {
        const float base = std::sin(0.37f * float(i)) + 0.1f * float(i % 7);
        part.baseline.push_back(base);
        part.expected.push_back(base * (1.0f + 0.004f * std::cos(float(i))));  // what bf16 does
        // unit 1 of checkpoint 1 far off; the rest near expected
        const bool off = i >= (3 + 1) * 32 && i < (3 + 2) * 32;
        part.engine.push_back(base * (1.0f + (off ? 0.3f : 0.003f) * std::sin(1.3f * float(i))));
    }
    if (!threeWay)
        part.baseline.clear();
    s.parts.push_back(part);
    return s;
}

// (the messages of QVERIFY2 are made whether it fails or not)
std::string firstEvidence(const PromptAnalysis& p)
{
    return p.suspects.empty() ? std::string() : p.suspects.front().evidence;
}

ModelCaptureOptions hybrid(FaultKind fault, bool threeWay)
{
    ModelCaptureOptions o;
    o.hybrid = true;
    o.fault = fault;
    o.baseline = threeWay;
    o.threads = 1;
    return o;
}

}  // namespace

class TestStateSuspects : public QObject {
    Q_OBJECT
private slots:
    void metricsAgainstDoubleReference();
    void smallUnitsGroupedIntoCells();
    void layersInTheModelsOrder();
    void faultsNamedAtTheirLayerAndCheckpoint_data();
    void faultsNamedAtTheirLayerAndCheckpoint();
    void cleanHybridsHaveNoSuspect_data();
    void cleanHybridsHaveNoSuspect();
    void attentionFaultUpstreamRanksFirst();
    void jsonCarriesTheStates();
    void rowsAndWordsOfACheckpoint();
    void histogramOfAStateHead();

private:
    AnalysisResult analyse(const ModelCaptureOptions& o, nlohmann::json* truth = nullptr)
    {
        const std::string path = m_dir.filePath(QString("c%1.h5").arg(m_count++)).toStdString();
        writeModelCapture(path, o);
        auto reader = std::make_shared<BundleReader>(path);
        if (truth)
            *truth = nlohmann::json::parse(reader->metadata().extra.at("synthetic_fault"));
        AnalysisResult r = analyzeBundle(reader);
        std::remove(path.c_str());
        return r;
    }
    QTemporaryDir m_dir;
    int m_count = 0;
};

void TestStateSuspects::metricsAgainstDoubleReference()
{
    for (const bool threeWay : {true, false}) {
        const LayerState s = handState(threeWay);
        const StateLayerAnalysis a = analyzeLayerState(s, 0, SuspectThresholds{}, 1000);
        QCOMPARE(a.unitRoundoff, std::ldexp(1.0, -24));  // float32 everywhere
        const StatePartAnalysis& part = a.parts.at(0);
        QCOMPARE(part.units, std::int64_t(3));
        std::vector<double> baseByCell(6);
        for (int cell = 0; cell < 6; ++cell) {
            auto slice = [&](const std::vector<float>& v) {
                return std::vector<double>(v.begin() + cell * 32, v.begin() + (cell + 1) * 32);
            };
            const std::vector<double> e = slice(s.parts[0].engine), x = slice(s.parts[0].expected);
            QVERIFY(std::abs(part.relL2[std::size_t(cell)] - relL2(x, e)) <= 1e-6 * relL2(x, e) + 1e-9);
            if (threeWay) {
                const std::vector<double> b = slice(s.parts[0].baseline);
                baseByCell[std::size_t(cell)] = relL2(b, x);
                QVERIFY(std::abs(part.baseRelL2[std::size_t(cell)] - baseByCell[std::size_t(cell)]) <= 1e-6 * baseByCell[std::size_t(cell)]);
            }
        }
        for (int c = 0; c < 2; ++c)
            for (int u = 0; u < 3; ++u) {
                const int cell = c * 3 + u;
                auto slice = [&](const std::vector<float>& v) {
                    return std::vector<double>(v.begin() + cell * 32, v.begin() + (cell + 1) * 32);
                };
                double expectedRatio = 0;
                if (threeWay) {
                    // floor: the cell's base error, at least the checkpoint's median (upper middle of 3)
                    std::vector<double> base{baseByCell[std::size_t(c * 3)], baseByCell[std::size_t(c * 3 + 1)],
                                             baseByCell[std::size_t(c * 3 + 2)]};
                    std::sort(base.begin(), base.end());
                    const double floor = std::max({baseByCell[std::size_t(cell)], base[1], 0.25 * a.unitRoundoff});
                    expectedRatio = relL2(slice(s.parts[0].baseline), slice(s.parts[0].engine)) / floor;
                } else {
                    expectedRatio = relL2(slice(s.parts[0].expected), slice(s.parts[0].engine)) / a.unitRoundoff;
                }
                QVERIFY2(std::abs(part.ratio[std::size_t(cell)] - expectedRatio) <= 1e-5 * expectedRatio,
                         qPrintable(QString("cell %1: %2 vs %3").arg(cell).arg(part.ratio[std::size_t(cell)]).arg(expectedRatio)));
            }
        // The far-off unit is off; three-way the others are noise (ratio near 1).
        QVERIFY(part.ratio[4] > a.offThreshold);
        if (threeWay) {
            QCOMPARE(a.offCells(0), 0);
            QCOMPARE(a.offCells(1), 1);
            std::int64_t unit = -1;
            a.worstRatio(1, nullptr, &unit);
            QCOMPARE(unit, std::int64_t(1));
        }
    }
}

void TestStateSuspects::smallUnitsGroupedIntoCells()
{
    LayerState s;
    StatePartValues conv;
    conv.name = "conv";
    conv.shape = {2, 192, 3};  // 192 channels of 3 values: runs of 12 (36 values), the first divisor past 32
    StatePartValues tiny;
    tiny.name = "tiny";
    tiny.shape = {2, 6, 3};    // 18 values in all: one cell
    StatePartValues ssm;
    ssm.name = "ssm";
    ssm.shape = {2, 8, 16, 16};  // a head is 256 values: as it is
    s.parts = {conv, tiny, ssm};
    groupSmallUnits(s);
    QCOMPARE(s.parts[0].shape, (std::vector<std::int64_t>{2, 16, 36}));
    QCOMPARE(s.parts[0].unitsPerCell, std::int64_t(12));
    QCOMPARE(s.parts[1].shape, (std::vector<std::int64_t>{2, 1, 18}));
    QCOMPARE(s.parts[2].shape, (std::vector<std::int64_t>{2, 8, 16, 16}));
    QCOMPARE(s.parts[2].unitsPerCell, std::int64_t(1));
}

void TestStateSuspects::layersInTheModelsOrder()
{
    const KvCacheConfig config = KvCacheConfig::fromJson(configJson(
        8, 1, 2, 4, {{{"model.layers.1.self_attn", "model.layers.3.self_attn"}, "FullAttentionSpec", 4},
                     {{"model.layers.0.mixer", "model.layers.2.mixer"}, "MambaSpec", 4}}));
    QCOMPARE(modelLayerOrder(config), (std::vector<std::string>{"model.layers.0.mixer", "model.layers.1.self_attn",
                                                                "model.layers.2.mixer", "model.layers.3.self_attn"}));
}

void TestStateSuspects::faultsNamedAtTheirLayerAndCheckpoint_data()
{
    QTest::addColumn<int>("fault");
    QTest::addColumn<bool>("threeWay");
    QTest::addColumn<int>("variant");  // 0: the tuned capture; 1-3: held out
    const std::pair<FaultKind, const char*> kinds[] = {{FaultKind::StateStale, "state_stale"},
                                                       {FaultKind::StateOtherRequest, "state_other_request"},
                                                       {FaultKind::StateNotReset, "state_not_reset"},
                                                       {FaultKind::StateZeros, "zeros"},
                                                       {FaultKind::StateScale, "scale"}};
    for (const auto& [kind, name] : kinds)
        for (const bool threeWay : {true, false})
            for (int variant = 0; variant < 4; ++variant)
                QTest::newRow(qPrintable(QString("%1 %2 %3").arg(name, threeWay ? "three-way" : "two-way",
                                                                  variant ? QString("held-out %1").arg(variant) : "tuned")))
                    << int(kind) << threeWay << variant;
}

void TestStateSuspects::faultsNamedAtTheirLayerAndCheckpoint()
{
    QFETCH(int, fault);
    QFETCH(bool, threeWay);
    QFETCH(int, variant);
    ModelCaptureOptions o = hybrid(FaultKind(fault), threeWay);
    // Held out (never tuned on): another seed, model and TP size, another layer and checkpoint.
    if (variant == 1) {
        o.seed = 11;
        o.shape.layers = 8;
        o.faultLayer = 4;
        o.promptLens = {40, 56};
    } else if (variant == 2) {
        o.seed = 23;
        o.tpSize = 4;
        o.shape.mamba.heads = 8;
        o.shape.mamba.groups = 1;  // one B/C group on every rank
        o.faultLayer = 0;
    } else if (variant == 3) {
        o.seed = 5;
        o.tpSize = 1;
        o.shape.mamba.engineStateBf16 = true;
        o.promptLens = {100, 90, 30};
        o.faultStep = 0;  // a decode checkpoint
    }
    nlohmann::json truth;
    AnalysisResult r;
    try {
        r = analyse(o, &truth);
    } catch (const std::exception& e) {
        QFAIL(e.what());
    }
    const std::string prompt = truth.at("prompt").get<std::string>();
    const PromptAnalysis* p = nullptr;
    for (const PromptAnalysis& q : r.prompts)
        if (q.id == prompt)
            p = &q;
    QVERIFY(p);
    QVERIFY2(!p->suspects.empty(), qPrintable(QString::fromStdString(truth.dump())));
    const Suspect& s = p->suspects.front();
    const QString said = QString::fromStdString(s.evidence);
    QCOMPARE(s.pattern, SuspectPattern::State);
    QCOMPARE(s.firstLayer, truth.at("layer").get<std::string>());
    QCOMPARE(s.firstToken, truth.at("position").get<std::int64_t>() - 1);
    const std::string expected = truth.at("kind").get<std::string>() == "state_zeros"   ? "zeros"
                                 : truth.at("kind").get<std::string>() == "state_scale" ? "scale"
                                                                                        : truth.at("kind").get<std::string>();
    QVERIFY2(s.hypothesis.kind == expected, qPrintable(said));
    if (expected == "state_stale")
        QCOMPARE(std::int64_t(s.hypothesis.parameter("holds_position")), truth.at("holds_position").get<std::int64_t>());
    if (expected == "state_other_request" || expected == "state_not_reset")
        QCOMPARE(s.hypothesis.label("prompt"), truth.at(expected == "state_not_reset" ? "leftover_prompt" : "holds_prompt").get<std::string>());
    if (expected == "scale" || expected == "state_not_reset")
        QVERIFY2(std::abs(s.hypothesis.parameter("factor") - truth.at("factor").get<double>()) < 0.02, qPrintable(said));
    // The other prompts: nothing.
    for (const PromptAnalysis& q : r.prompts)
        if (q.id != prompt)
            QVERIFY2(q.suspects.empty(), qPrintable(QString::fromStdString(q.id + ": " + firstEvidence(q))));
}

void TestStateSuspects::cleanHybridsHaveNoSuspect_data()
{
    QTest::addColumn<int>("tokens");
    QTest::addColumn<bool>("threeWay");
    for (const int tokens : {1000, 8000})
        for (const bool threeWay : {true, false})
            QTest::newRow(qPrintable(QString("%1 tokens %2").arg(tokens).arg(threeWay ? "three-way" : "two-way")))
                << tokens << threeWay;
}

void TestStateSuspects::cleanHybridsHaveNoSuspect()
{
    QFETCH(int, tokens);
    QFETCH(bool, threeWay);
    ModelCaptureOptions o = hybrid(FaultKind::None, threeWay);
    o.promptLens = {tokens};
    o.threads = 0;
    const AnalysisResult r = analyse(o);
    QVERIFY(r.notCompared.empty());  // the state-space layers are compared too
    const PromptAnalysis& p = r.prompts.at(0);
    QCOMPARE(p.states.size(), std::size_t(2));  // layers 0 and 2
    for (const StateLayerAnalysis& a : p.states) {
        QVERIFY2(a.problem.empty(), qPrintable(QString::fromStdString(a.problem)));
        QCOMPARE(a.positions.back(), std::int64_t(tokens + 10 - 1));  // the end of the engine's run
        for (std::size_t c = 0; c < a.positions.size(); ++c)
            QCOMPARE(a.offCells(c), 0);
    }
    QVERIFY2(p.suspects.empty(), qPrintable(QString::fromStdString(firstEvidence(p))));
}

void TestStateSuspects::attentionFaultUpstreamRanksFirst()
{
    // Layer 1's K rotated for position + 3 in part of the prefill: the engine runs on from it,
    // and the Mamba2 layer below (2) drifts past its off threshold.
    ModelCaptureOptions o = hybrid(FaultKind::RopePrefill, true);
    o.faultLayer = 1;
    o.promptLens = {200};
    const AnalysisResult r = analyse(o);
    const PromptAnalysis& p = r.prompts.at(0);
    QVERIFY(!p.suspects.empty());
    const Suspect& top = p.suspects.front();
    QCOMPARE(top.firstLayer, std::string("model.layers.1.self_attn"));
    QCOMPARE(top.hypothesis.kind, std::string("rope_offset"));
    const auto mixer = std::find_if(p.states.begin(), p.states.end(),
                                    [](const StateLayerAnalysis& a) { return a.layer == "model.layers.2.mixer"; });
    QVERIFY(mixer != p.states.end());
    float worst = 0;
    for (std::size_t c = 0; c < mixer->positions.size(); ++c)
        worst = std::max(worst, mixer->worstRatio(c));
    QVERIFY2(worst > mixer->offThreshold, qPrintable(QString::number(worst)));  // it does drift
    QVERIFY(std::find(top.layers.begin(), top.layers.end(), "model.layers.2.mixer") != top.layers.end());
    for (const Suspect& s : p.suspects)
        QVERIFY(s.pattern != SuspectPattern::State);  // spread, not a suspect of its own
}

void TestStateSuspects::jsonCarriesTheStates()
{
    const AnalysisResult r = analyse(hybrid(FaultKind::StateZeros, true));
    std::ostringstream out;
    writeAnalysisJson(r, out);
    const nlohmann::json j = nlohmann::json::parse(out.str());
    for (std::size_t i = 0; i < r.prompts.size(); ++i) {
        const PromptAnalysis& p = r.prompts[i];
        const nlohmann::json& states = j.at("prompts").at(i).at("states");
        QCOMPARE(states.size(), p.states.size());
        for (std::size_t l = 0; l < p.states.size(); ++l) {
            const StateLayerAnalysis& a = p.states[l];
            QCOMPARE(states[l].at("layer").get<std::string>(), a.layer);
            QCOMPARE(states[l].at("positions").get<std::vector<std::int64_t>>(), a.positions);
            for (std::size_t part = 0; part < a.parts.size(); ++part) {
                const nlohmann::json& jp = states[l].at("parts").at(part);
                QCOMPARE(jp.at("name").get<std::string>(), a.parts[part].name);
                for (std::size_t c = 0; c < a.positions.size(); ++c)
                    for (std::int64_t u = 0; u < a.parts[part].units; ++u)
                        QCOMPARE(jp.at("ratio").at(c).at(std::size_t(u)).get<float>(), a.parts[part].at(a.parts[part].ratio, c, u));
            }
        }
    }
    QCOMPARE(j.at("suspects").at(0).at("pattern").get<std::string>(), std::string("state"));
}

void TestStateSuspects::rowsAndWordsOfACheckpoint()
{
    // The hand-made state (three-way): unit 1 of the checkpoint at 16 far off.
    PromptAnalysis p;
    p.states = {analyzeLayerState(handState(true), 0, SuspectThresholds{}, 1000)};
    const StateLayerAnalysis& a = p.states[0];
    const std::vector<StateRow> rows = stateRows(p);
    QCOMPARE(rows.size(), std::size_t(1));
    QCOMPARE(rows[0].label, std::string("model.layers.0 [ssm]"));
    QCOMPARE(rows[0].cells.size(), std::size_t(2));
    QCOMPARE(rows[0].cells[1].token, std::int64_t(15));  // the state after [0, 16) sits at token 15
    QCOMPARE(rows[0].cells[1].offs, double(a.parts[0].ratio[4]) / a.offThreshold);
    QVERIFY(rows[0].cells[1].offs > 1 && rows[0].cells[0].offs < 1);
    QCOMPARE(stateCellNear(rows[0], 13, 2)->checkpoint, std::size_t(1));
    QVERIFY(!stateCellNear(rows[0], 11, 2));
    const std::string text = stateCellText(a, 1);
    QVERIFY2(text.find("the state after position 16") != std::string::npos, text.c_str());
    QVERIFY2(text.find("ssm heads: 1 (" + shortNumber(a.parts[0].ratio[4]) + ")") != std::string::npos, text.c_str());
    QVERIFY2(text.find("(none off)") == std::string::npos, text.c_str());
    QVERIFY2(stateCellText(a, 0).find("(none off)") != std::string::npos, stateCellText(a, 0).c_str());
}

void TestStateSuspects::histogramOfAStateHead()
{
    // A stale state in layer 2 of prompt_0 at position 16: SSM head 0's 16 x 16 values at that
    // checkpoint, |baseline - engine| far above |baseline - expected|; the same head at 8 (before it) not.
    const std::string path = m_dir.filePath("histogram.h5").toStdString();
    writeModelCapture(path, hybrid(FaultKind::StateStale, true));
    const CaptureLoader loader(std::make_shared<BundleReader>(path));
    const HeadErrorHistogram at = stateErrorHistogram(loader, "prompt_0", "model.layers.2.mixer", 16, "ssm", 0);
    QCOMPARE(at.actual.total(), std::uint64_t(16 * 16));
    QVERIFY(at.base && at.base->total() == 16 * 16);
    QVERIFY(at.bc < 0.5);
    const HeadErrorHistogram before = stateErrorHistogram(loader, "prompt_0", "model.layers.2.mixer", 8, "ssm", 0);
    QVERIFY(before.bc > 0.5);
    bool refused = false;
    try {
        stateErrorHistogram(loader, "prompt_0", "model.layers.2.mixer", 9, "ssm", 0);
    } catch (const std::invalid_argument&) {
        refused = true;  // no checkpoint there
    }
    QVERIFY(refused);
}

QTEST_GUILESS_MAIN(TestStateSuspects)
#include "tst_state_suspects.moc"
