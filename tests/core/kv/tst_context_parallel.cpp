// Decode context parallelism end to end: synthetic captures whose ranks each hold their DCP
// rank's share of the positions (GQA heads and an MLA latent, runs of 1 and 2) analyse clean,
// and a fault in one rank's share is found and attributed to that DCP rank and its TP ranks; a
// table entry gone wrong names the entry of block_size x dcp positions; a replica of one share
// that differs is reported with its rank and block. (The placement itself is tested against
// vLLM's slot mapping in tst_reconstruction and the Python cross-language tests.)

#include "analysis/analyzer.h"
#include "analysis/threshold_check.h"
#include "synth/model_capture.h"
#include "small_model.h"

#include <nlohmann/json.hpp>

#include <QTemporaryDir>
#include <QTest>

using namespace kvscope;
using namespace kvscope::synth;

namespace {

// The small model over TP 4 with two KV heads (each on two ranks), split by DCP 2; or the MLA model
// (the latent on all four ranks).
ModelCaptureOptions dcpModel(bool mla, int interleave, FaultKind fault = FaultKind::None)
{
    ModelCaptureOptions o = kvtest::smallModel(fault);
    o.shape.kvHeads = 2;
    if (mla) {
        o = withMla(o);
        o.shape.kvLoraRank = 64;
        o.shape.ropeHeadDim = 16;
    }
    o.tpSize = 4;
    o.dcpSize = 2;
    o.cpInterleave = interleave;
    o.faultLayer = 3;
    return o;
}

}  // namespace

class TestContextParallel : public QObject {
    Q_OBJECT
private slots:
    void cleanCaptureHasNoSuspect_data();
    void cleanCaptureHasNoSuspect();
    void oneShareUnwrittenNamesItsDcpRank_data();
    void oneShareUnwrittenNamesItsDcpRank();
    void oneShareScaledEveryLayer();
    void staleEntryCoversBlockTimesDcp();
    void positionFaultIsNotPinnedOnARank();
    void replicaOfAShareThatDiffers();
    void rejectsInconsistentOptions();

private:
    AnalysisResult run(const ModelCaptureOptions& o, const QString& name, nlohmann::json* truth = nullptr)
    {
        return kvtest::analyseModelCapture(m_dir.filePath(name).toStdString(), o, truth);
    }
    QTemporaryDir m_dir;
};

void TestContextParallel::cleanCaptureHasNoSuspect_data()
{
    QTest::addColumn<bool>("mla");
    QTest::addColumn<int>("interleave");
    QTest::addColumn<bool>("threeWay");
    QTest::newRow("heads, runs of 1") << false << 1 << true;
    QTest::newRow("heads, runs of 2, two-way") << false << 2 << false;
    QTest::newRow("latent, runs of 1") << true << 1 << true;
    QTest::newRow("latent, runs of 4, two-way") << true << 4 << false;
}

void TestContextParallel::cleanCaptureHasNoSuspect()
{
    QFETCH(bool, mla);
    QFETCH(int, interleave);
    QFETCH(bool, threeWay);
    ModelCaptureOptions o = dcpModel(mla, interleave);
    o.baseline = threeWay;
    const AnalysisResult r = run(o, QString("clean_%1_%2_%3.h5").arg(mla).arg(interleave).arg(threeWay));
    QCOMPARE(r.prompts.size(), std::size_t(2));
    for (const PromptAnalysis& p : r.prompts) {
        QVERIFY2(p.suspects.empty(), p.suspects.empty() ? "" : p.suspects.front().evidence.c_str());
        QVERIFY(p.replicaDifferences.empty());
        QVERIFY(p.problems.empty());
    }
    QVERIFY(checkThresholds(r, {}).empty());
}

void TestContextParallel::oneShareUnwrittenNamesItsDcpRank_data()
{
    QTest::addColumn<bool>("mla");
    QTest::addColumn<int>("interleave");
    QTest::addColumn<int>("rank");
    QTest::addColumn<std::vector<int>>("tpRanks");  // the rank and any replica of its share
    // Heads: ranks 0, 1 hold head 0 (DCP ranks 0, 1), ranks 2, 3 head 1.
    QTest::newRow("heads, rank 1") << false << 1 << 1 << std::vector<int>{1};
    QTest::newRow("heads, rank 2, runs of 2") << false << 2 << 2 << std::vector<int>{2};
    // The latent: ranks 0 and 2 hold DCP rank 0's share, 1 and 3 DCP rank 1's.
    QTest::newRow("latent, rank 1") << true << 1 << 1 << std::vector<int>{1, 3};
    QTest::newRow("latent, rank 0, runs of 4") << true << 4 << 0 << std::vector<int>{0, 2};
}

void TestContextParallel::oneShareUnwrittenNamesItsDcpRank()
{
    QFETCH(bool, mla);
    QFETCH(int, interleave);
    QFETCH(int, rank);
    QFETCH(std::vector<int>, tpRanks);
    ModelCaptureOptions o = dcpModel(mla, interleave, FaultKind::RankUnwritten);
    o.faultRank = rank;
    nlohmann::json truth;
    const AnalysisResult r = run(o, QString("unwritten_%1_%2_%3.h5").arg(mla).arg(interleave).arg(rank), &truth);
    QCOMPARE(truth["dcp_rank"].get<int>(), rank % 2);
    QCOMPARE(r.suspects.size(), std::size_t(1));
    const Suspect& s = r.suspects.front();
    QCOMPARE(QString::fromStdString(s.firstLayer), QString("model.layers.3.self_attn"));
    QCOMPARE(s.pattern, SuspectPattern::TpRank);
    QCOMPARE(s.hypothesis.kind, std::string("zeros"));
    QCOMPARE(s.dcpRanks, std::vector<int>{rank % 2});
    QCOMPARE(s.tpRanks, tpRanks);
    QVERIFY2(s.evidence.find("DCP rank(s) " + std::to_string(rank % 2) + " of 2") != std::string::npos, s.evidence.c_str());
    if (!mla)
        QCOMPARE(s.heads, std::vector<int>{rank / 2});
}

void TestContextParallel::oneShareScaledEveryLayer()
{
    // V of TP rank 3's share (DCP rank 1; head 1) 1.25x in every layer: found at layer 0.
    ModelCaptureOptions o = dcpModel(false, 1, FaultKind::RankVScale);
    o.faultRank = 3;
    const AnalysisResult r = run(o, "vscale.h5");
    QCOMPARE(r.suspects.size(), std::size_t(1));
    const Suspect& s = r.suspects.front();
    QCOMPARE(s.pattern, SuspectPattern::TpRank);
    QCOMPARE(s.kv, std::string("v"));
    QCOMPARE(s.dcpRanks, std::vector<int>{1});
    QCOMPARE(s.tpRanks, std::vector<int>{3});
    QCOMPARE(s.hypothesis.kind, std::string("scale"));
    QVERIFY(std::fabs(s.hypothesis.parameter("factor") - 1.25) < 0.02);
}

void TestContextParallel::staleEntryCoversBlockTimesDcp()
{
    // One table entry of the full-attention group (block size 8, so 16 positions under DCP 2)
    // points at another sequence's block on every rank.
    nlohmann::json truth;
    const AnalysisResult r = run(dcpModel(false, 1, FaultKind::StaleBlock), "stale.h5", &truth);
    const std::int64_t logical = truth["logical_block"].get<std::int64_t>();
    QCOMPARE(truth["positions"][0].get<std::int64_t>(), logical * 16);
    QVERIFY(!r.suspects.empty());
    const Suspect& s = r.suspects.front();
    QCOMPARE(s.pattern, SuspectPattern::Block);
    QVERIFY(s.firstToken >= logical * 16 && s.lastToken < (logical + 1) * 16);
    QCOMPARE(s.blocks.size(), std::size_t(1));
    QCOMPARE(s.blocks.front().logical, logical);
    QCOMPARE(s.blocks.front().physical, truth["stale_block"].get<std::int64_t>());
    QVERIFY(s.dcpRanks == (std::vector<int>{0, 1}));  // both shares of the entry
}

void TestContextParallel::positionFaultIsNotPinnedOnARank()
{
    // K of decode positions rotated for position + 1: every DCP rank's positions, so no rank.
    const AnalysisResult r = run(dcpModel(false, 1, FaultKind::RopeOffset), "rope.h5");
    QCOMPARE(r.suspects.size(), std::size_t(1));
    const Suspect& s = r.suspects.front();
    QCOMPARE(s.hypothesis.kind, std::string("rope_offset"));
    QCOMPARE(s.pattern, SuspectPattern::Position);
    QVERIFY(s.dcpRanks == (std::vector<int>{0, 1}));
}

void TestContextParallel::replicaOfAShareThatDiffers()
{
    // The latent on TP 4 with DCP 2: ranks 2 and 3 copy ranks 0 and 1. Rank 3's copy of one block differs.
    ModelCaptureOptions o = dcpModel(true, 1, FaultKind::ReplicaDiff);
    o.faultRank = 3;
    nlohmann::json truth;
    const AnalysisResult r = run(o, "replica.h5", &truth);
    std::vector<ReplicaDifference> all;
    for (const PromptAnalysis& p : r.prompts)
        all.insert(all.end(), p.replicaDifferences.begin(), p.replicaDifferences.end());
    QCOMPARE(all.size(), std::size_t(1));
    QCOMPARE(all.front().rank, 3);
    QCOMPARE(all.front().againstRank, 1);
    QCOMPARE(all.front().physicalBlock, truth["block"].get<std::int64_t>());
    QCOMPARE(all.front().logicalBlock, truth["logical_block"].get<std::int64_t>());
    QVERIFY(r.suspects.empty());
    // Rank 2 copies rank 0's share, which the analysis reads: a replica_diff there is refused too.
    o.faultRank = 1;
    QVERIFY_THROWS_EXCEPTION(std::invalid_argument, run(o, "refused.h5"));
}

void TestContextParallel::rejectsInconsistentOptions()
{
    ModelCaptureOptions o = dcpModel(false, 1);
    o.dcpSize = 4;  // two KV heads on TP 4: each head is on two ranks
    QVERIFY_THROWS_EXCEPTION(std::invalid_argument, run(o, "bad1.h5"));
    o = dcpModel(false, 3);  // runs of 3 in blocks of 8
    QVERIFY_THROWS_EXCEPTION(std::invalid_argument, run(o, "bad2.h5"));
    o = dcpModel(false, 1, FaultKind::ShardSwap);
    QVERIFY_THROWS_EXCEPTION(std::invalid_argument, run(o, "bad3.h5"));
}

QTEST_APPLESS_MAIN(TestContextParallel)
#include "tst_context_parallel.moc"
