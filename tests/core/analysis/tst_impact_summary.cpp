// Whether a suspect matters (analysis/impact_summary.h, impact_json.h) and check --max-kl
// (analysis/threshold_check.h), on hand-made impact records whose medians, maxima and top-1
// counts are worked out here; and on synthetic captures: a clean one passes --max-kl, a RoPE
// fault's fails, and its suspect says what the engine's KV from its onset on does.

#include "analysis/analyzer.h"
#include "analysis/impact_json.h"
#include "analysis/impact_summary.h"
#include "analysis/threshold_check.h"
#include "synth/model_capture.h"
#include "util/json_writer.h"

#include <QTemporaryDir>
#include <QTest>

#include <sstream>

using namespace kvscope;

namespace {

const std::string kL0 = "model.layers.0.self_attn", kL1 = "model.layers.1.self_attn";

// A prompt whose record holds `rows`, each with its steps' KL and top-1 flags.
PromptAnalysis prompt(const std::string& id, const std::vector<std::tuple<Transplant, std::vector<double>, std::vector<int>>>& rows)
{
    PromptAnalysis p;
    p.id = id;
    p.promptLen = 10;
    p.layers = {kL0, kL1};
    ImpactRecord r;
    r.computedBy = "hand";
    for (const auto& [t, kl, changed] : rows) {
        r.transplants.push_back(t);
        r.steps = std::int64_t(kl.size());
        r.kl.insert(r.kl.end(), kl.begin(), kl.end());
        for (int c : changed)
            r.top1Changed.push_back(std::int8_t(c));
    }
    p.impact = r;
    return p;
}

Suspect suspectAt(const std::string& layer, std::vector<std::string> prompts)
{
    Suspect s;
    s.pattern = SuspectPattern::Position;
    s.firstLayer = layer;
    s.prompts = std::move(prompts);
    return s;
}

}  // namespace

class TestImpactSummary : public QObject {
    Q_OBJECT
private slots:
    // Two prompts of 4 steps: the suspect's `from` row pooled over 8 steps, sorted 0.01 0.02 0.03
    // 0.04 0.05 0.1 0.2 0.8: median 0.045, max 0.8, 3 changes; the baseline's: max 0.002, 0 changes.
    void aSuspectSaysWhatItDoes()
    {
        const Transplant from{TransplantKind::From, kL1, {}}, noise{TransplantKind::BaselineFrom, kL1, {}},
            alone{TransplantKind::Layer, kL1, {}};
        std::vector<PromptAnalysis> prompts{
            prompt("a", {{from, {0.01, 0.2, 0.03, 0.8}, {0, 1, 0, 1}}, {noise, {0.001, 0.002, 0.001, 0.001}, {0, 0, 0, 0}},
                         {alone, {0.01, 0.1, 0.01, 0.4}, {0, 1, 0, 0}}}),
            prompt("b", {{from, {0.02, 0.04, 0.05, 0.1}, {0, 0, 1, 0}}, {noise, {0.001, 0.001, 0.001, 0.001}, {0, 0, 0, 0}}})};
        std::vector<Suspect> suspects{suspectAt(kL1, {"a", "b"}), suspectAt(kL0, {"a"})};
        Suspect state = suspectAt(kL1, {"a"});
        state.pattern = SuspectPattern::State;
        suspects.push_back(state);
        attachImpact(suspects, prompts);
        QVERIFY(suspects[0].impact);
        const SuspectImpact& i = *suspects[0].impact;
        QCOMPARE(i.engine.steps, 8);
        QCOMPARE(i.engine.top1Changed, 3);
        QVERIFY(qFuzzyCompare(i.engine.klMedian, 0.045));
        QCOMPARE(i.engine.klMax, 0.8);
        QCOMPARE(i.noise->klMax, 0.002);
        QCOMPARE(i.noise->top1Changed, 0);
        QCOMPARE(i.alone->steps, 4);  // prompt b holds no such row
        QCOMPARE(i.alone->klMax, 0.4);
        QCOMPARE(i.prompts, (std::vector<std::string>{"a", "b"}));
        QVERIFY2(i.text.find("changes the next token at 3 of 8 decode steps (KL median 0.045, up to 0.8 nats)") != std::string::npos,
                 i.text.c_str());
        QVERIFY2(i.text.find("at 0 of 8 (up to 0.002): 400x the noise") != std::string::npos, i.text.c_str());
        QVERIFY2(!suspects[1].impact, "no record holds a `from` row of layer 0");
        QVERIFY2(!suspects[2].impact, "a state layer is never replaced");

        // The JSON keeps it (results files read suspects back).
        std::ostringstream out;
        {
            JsonWriter w(out);
            w.beginObject();
            writeSuspectImpact(w, suspects[0].impact);
            w.endObject();
        }
        const JsonFields f("made");
        const std::optional<SuspectImpact> back = readSuspectImpact(f, JsonFields::Json::parse(out.str()), "");
        QVERIFY(back);
        QCOMPARE(back->text, i.text);
        QCOMPARE(back->engine.klMedian, i.engine.klMedian);
        QCOMPARE(back->alone->klMax, i.alone->klMax);
        QCOMPARE(back->prompts, i.prompts);
    }

    void perLayerFigures()
    {
        const std::vector<PromptAnalysis> prompts{prompt("a", {{{TransplantKind::Layer, kL0, {}}, {0.3, 0.1, 0.2}, {1, 0, 0}},
                                                              {{TransplantKind::Baseline, kL0, {}}, {0.01, 0.03, 0.02}, {0, 0, 0}}})};
        const std::vector<LayerImpact> l = layerImpacts(prompts, {"a"}, {kL0, kL1});
        QCOMPARE(l.size(), std::size_t(2));
        QCOMPARE(l[0].alone->klMedian, 0.2);
        QCOMPARE(l[0].alone->top1Changed, 1);
        QCOMPARE(l[0].aloneNoise->klMax, 0.03);
        QVERIFY(!l[0].from && !l[1].alone);
    }

    // --max-kl: the `from` row of the first analysed layer, its worst step named; a prompt without
    // a record fails; the floors are not judged (a suspect alone passes).
    void checkJudgesTheOutput()
    {
        AnalysisResult r;
        r.prompts.push_back(prompt("a", {{{TransplantKind::From, kL0, {}}, {0.001, 0.02, 0.004}, {0, 1, 0}}}));
        r.suspects.push_back(suspectAt(kL0, {"a"}));
        Thresholds t;
        t.maxKl = 0.05;
        QVERIFY(checkThresholds(r, t).empty());
        t.maxKl = 0.01;
        std::vector<Violation> v = checkThresholds(r, t);
        QCOMPARE(v.size(), std::size_t(1));
        QCOMPARE(v[0].value, 0.02);
        QCOMPARE(v[0].token, std::int64_t(11));  // step 1 predicts prompt_len + 1
        QCOMPARE(v[0].layer, kL0);
        QVERIFY2(v[0].detail.find("at 1 of 3 decode steps") != std::string::npos, v[0].detail.c_str());
        r.prompts.push_back(prompt("b", {}));
        r.prompts.back().impact.reset();
        v = checkThresholds(r, t);
        QCOMPARE(v.size(), std::size_t(2));
        QVERIFY2(v[1].detail.find("kvscope_capture impact") != std::string::npos, v[1].detail.c_str());
    }

    // Captures made by the synth (their impact measured with its model): a clean one passes
    // --max-kl 0.005 (bf16 noise reaches about 1.3e-3 nats there) and the suspect-free floors; a
    // RoPE offset's fails it, and its suspect carries the impact of layer 3 on.
    void synthCaptures()
    {
        QTemporaryDir dir;
        synth::ModelCaptureOptions o;
        o.shape.layers = 8;
        const std::string clean = dir.filePath("clean.h5").toStdString(), faulty = dir.filePath("rope.h5").toStdString();
        synth::writeModelCapture(clean, o);
        o.fault = synth::FaultKind::RopeOffset;
        o.faultLayer = 5;
        synth::writeModelCapture(faulty, o);
        Thresholds t;
        t.maxKl = 0.005;
        const AnalysisResult c = analyzeForVerdict(std::make_shared<BundleReader>(clean));
        QVERIFY(checkThresholds(c, t).empty());
        const AnalysisResult f = analyzeForVerdict(std::make_shared<BundleReader>(faulty));
        QVERIFY(!checkThresholds(f, t).empty());
        QVERIFY(!f.suspects.empty());
        const Suspect& s = f.suspects.front();
        QCOMPARE(s.firstLayer, std::string("model.layers.5.self_attn"));
        QVERIFY(s.impact);
        qInfo("%s", s.impact->text.c_str());
        QVERIFY(s.impact->noise);
        QVERIFY2(s.impact->engine.klMax > 5 * s.impact->noise->klMax, s.impact->text.c_str());
    }
};

QTEST_APPLESS_MAIN(TestImpactSummary)
#include "tst_impact_summary.moc"
