// MLA (DeepSeek's multi-head latent attention) end to end: the synthetic MLA model's captures
// are analysed as c_kv and k_pe, a clean one gives no suspect, a fault in one part of one layer
// gets the suspect and explanation that name that part and layer, and a TP rank whose copy of one
// block differs is reported with that rank, layer and block (and fails check).

#include "analysis/analysis_json.h"
#include "analysis/analyzer.h"
#include "analysis/threshold_check.h"
#include "format/bundle_reader.h"
#include "synth/model_capture.h"
#include "small_model.h"

#include <nlohmann/json.hpp>

#include <QTemporaryDir>
#include <QTest>

#include <sstream>

using namespace kvscope;
using namespace kvscope::synth;

namespace {

// 6 layers of latent attention (c_kv 64, k_pe 16), 8 query heads, TP 2, two prompts.
ModelCaptureOptions smallMla(FaultKind fault = FaultKind::None)
{
    ModelCaptureOptions o;
    o.shape.layers = 6;
    o.shape.hidden = 64;
    o.shape.queryHeads = 8;
    o.shape.headDim = 32;
    o.shape.ffn = 128;
    o = withMla(o);
    o.shape.kvLoraRank = 64;
    o.shape.ropeHeadDim = 16;
    o.tpSize = 2;
    o.promptLens = {24, 32};
    o.decodeTokens = 16;
    o.fault = fault;
    o.faultLayer = 3;
    return o;
}

}  // namespace

class TestMla : public QObject {
    Q_OBJECT
private slots:
    void cleanCaptureHasNoSuspect_data();
    void cleanCaptureHasNoSuspect();
    void faultInOnePartIsNamed_data();
    void faultInOnePartIsNamed();
    void replicaThatDiffersIsReported();
    void rejectsFaultsWithoutMeaning();

private:
    AnalysisResult run(const ModelCaptureOptions& o, const QString& name, nlohmann::json* truth = nullptr)
    {
        return kvtest::analyseModelCapture(m_dir.filePath(name).toStdString(), o, truth);
    }
    QTemporaryDir m_dir;
};

void TestMla::cleanCaptureHasNoSuspect_data()
{
    QTest::addColumn<bool>("threeWay");
    QTest::newRow("three-way") << true;
    QTest::newRow("two-way") << false;
}

void TestMla::cleanCaptureHasNoSuspect()
{
    QFETCH(bool, threeWay);
    ModelCaptureOptions o = smallMla();
    o.baseline = threeWay;
    const AnalysisResult r = run(o, threeWay ? "clean3.h5" : "clean2.h5");
    QCOMPARE(r.prompts.size(), std::size_t(2));
    for (const PromptAnalysis& p : r.prompts) {
        QCOMPARE(p.heads, 1);
        QCOMPARE(p.dims, HeadDims(64, 16));
        QCOMPARE(p.partNames[0], std::string("c_kv"));
        QCOMPARE(p.partNames[1], std::string("k_pe"));
        QVERIFY(p.replicaDifferences.empty());
        QVERIFY2(p.suspects.empty(), p.suspects.empty() ? "" : p.suspects.front().evidence.c_str());
        QVERIFY(p.problems.empty());
    }
    QVERIFY(checkThresholds(r, {}).empty());
    // The JSON says what the parts are and how wide.
    std::ostringstream json;
    writeAnalysisJson(r, json);
    const nlohmann::json doc = nlohmann::json::parse(json.str());
    QVERIFY(doc["prompts"][0]["part_names"] == nlohmann::json({"c_kv", "k_pe"}));
    QCOMPARE(doc["prompts"][0]["head_dim"].get<int>(), 64);
    QCOMPARE(doc["prompts"][0]["v_head_dim"].get<int>(), 16);
}

void TestMla::faultInOnePartIsNamed_data()
{
    QTest::addColumn<int>("fault");
    QTest::addColumn<QString>("kv");          // the part the suspect names: k (c_kv), v (k_pe), kv
    QTest::addColumn<QString>("hypothesis");  // its explanation
    QTest::addColumn<QString>("words");       // in its evidence
    QTest::newRow("k_pe rotated for position + 1") << int(FaultKind::RopeOffset) << "v" << "rope_offset"
                                                   << "k_pe rotated for position +1";
    QTest::newRow("k_pe in the other pair convention") << int(FaultKind::RopeConvention) << "v" << "rope_convention"
                                                       << "k_pe rotated in the other pair convention";
    QTest::newRow("c_kv negated") << int(FaultKind::KNegated) << "k" << "scale" << "c_kv is -1x";
    QTest::newRow("k_pe partly rotated") << int(FaultKind::PartialRotary) << "v" << "rope_dims"
                                         << "k_pe rotated over 8 dims where the model rotates 16";
}

void TestMla::faultInOnePartIsNamed()
{
    QFETCH(int, fault);
    QFETCH(QString, kv);
    QFETCH(QString, hypothesis);
    QFETCH(QString, words);
    const AnalysisResult r = run(smallMla(FaultKind(fault)), QString("fault%1.h5").arg(fault));
    QVERIFY(!r.suspects.empty());
    const Suspect& s = r.suspects.front();
    QCOMPARE(QString::fromStdString(s.firstLayer), QString("model.layers.3.self_attn"));
    QCOMPARE(QString::fromStdString(s.kv), kv);
    QCOMPARE(QString::fromStdString(s.hypothesis.kind), hypothesis);
    QVERIFY2(s.evidence.find(words.toStdString()) != std::string::npos, s.evidence.c_str());
    // One latent: no head to single out, and no "head" said.
    QVERIFY2(s.pattern != SuspectPattern::Head, s.evidence.c_str());
    QVERIFY2(s.evidence.find("head") == std::string::npos, s.evidence.c_str());
    QVERIFY(s.heads.empty());
}

void TestMla::replicaThatDiffersIsReported()
{
    ModelCaptureOptions o = smallMla(FaultKind::ReplicaDiff);
    o.tpSize = 4;
    o.faultRank = 2;
    nlohmann::json truth;
    const AnalysisResult r = run(o, "replica.h5", &truth);
    QCOMPARE(truth["rank"].get<int>(), 2);
    std::vector<ReplicaDifference> all;
    for (const PromptAnalysis& p : r.prompts)
        all.insert(all.end(), p.replicaDifferences.begin(), p.replicaDifferences.end());
    QCOMPARE(all.size(), std::size_t(1));
    const ReplicaDifference& d = all.front();
    QCOMPARE(d.rank, 2);
    QCOMPARE(d.againstRank, 0);
    QCOMPARE(d.layer, truth["layer"].get<std::string>());
    QCOMPARE(d.physicalBlock, truth["block"].get<std::int64_t>());
    QCOMPARE(d.logicalBlock, truth["logical_block"].get<std::int64_t>());
    QCOMPARE(d.part, std::string("c_kv"));
    QCOMPARE(d.blocks, 1);
    // The analysis reads rank 0's copy, which is right: the replica is the only finding, and check fails on it.
    QVERIFY(r.suspects.empty());
    const std::vector<Violation> v = checkThresholds(r, {});
    QCOMPARE(v.size(), std::size_t(1));
    QVERIFY(v.front().detail.find("TP rank 2's copy of c_kv of " + d.layer) != std::string::npos);
}

void TestMla::rejectsFaultsWithoutMeaning()
{
    for (FaultKind kind : {FaultKind::HeadSwap, FaultKind::KvSwap, FaultKind::ShardSwap, FaultKind::Fp8Scale}) {
        bool refused = false;
        try {
            run(smallMla(kind), "refused.h5");
        } catch (const std::invalid_argument& e) {
            refused = std::string(e.what()).find("does not apply to an MLA cache") != std::string::npos;
        }
        QVERIFY2(refused, faultName(kind).c_str());
    }
}

QTEST_APPLESS_MAIN(TestMla)
#include "tst_mla.moc"
