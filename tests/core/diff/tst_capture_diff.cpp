// kvscope diff: two captures of the same prompts against the same reference, compared in noise
// floors. Identical captures give nothing; a fault injected at layer L of B is reported at L
// (several seeds, both TP modes, cache-side and engine-side faults); a B better everywhere is
// no worse; other prompts, another reference or another mode cannot be compared; the suspects
// of the change place their off positions against the engine's structure as analyze does. The
// statistics are checked against a double-precision recomputation from the analysis's metrics.

#include "analysis/analysis_json.h"
#include "analysis/threshold_check.h"
#include "diff/capture_diff.h"
#include "diff/diff_json.h"
#include "format/bundle_error.h"
#include "kv/capture_loader.h"
#include "metric_reference.h"
#include "small_model.h"

#include <QProcess>
#include <QTemporaryDir>
#include <QTest>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>

using namespace kvscope;
using namespace kvscope::synth;
using namespace kvtest;

namespace {

struct Capture {
    std::shared_ptr<BundleReader> reader;
    AnalysisResult result;
};

Capture capture(const std::string& path, const ModelCaptureOptions& o)
{
    writeModelCapture(path, o);
    Capture c{std::make_shared<BundleReader>(path), {}};
    AnalysisOptions options;
    options.searchSuspects = false;
    c.result = analyzeForVerdict(c.reader, options);
    return c;
}

DiffResult diffOf(const Capture& a, const Capture& b, DiffOptions options = {})
{
    return diffAnalyses(diffSideOf(a.result), b.result, CaptureLoader(b.reader), options);
}

}  // namespace

class TestCaptureDiff : public QObject {
    Q_OBJECT

private slots:
    void initTestCase() { QVERIFY(m_dir.isValid()); }
    void identicalCapturesHaveNoRegression();
    void faultAtLayerIsReportedThere_data();
    void faultAtLayerIsReportedThere();
    void betterEverywhereIsNoWorse();
    void analysisJsonStandsForA();
    void capturesThatDoNotMatchAreRefused();
    void exitCodes();
    void metricsWithoutBcAreTheSame();
    void aSubsetOfLayersStandsForA();
    void engineOnlyBIsComparedAgainstAsReference();
    void theChangesSuspectsSayTheStructure();

private:
    std::string path(const std::string& name) const { return m_dir.filePath(QString::fromStdString(name)).toStdString(); }
    QTemporaryDir m_dir;
};

void TestCaptureDiff::identicalCapturesHaveNoRegression()
{
    const Capture a = capture(path("same_a.h5"), smallModel());
    const Capture b = capture(path("same_b.h5"), smallModel());  // written again: the same bits
    const DiffResult d = diffOf(a, b);
    QCOMPARE(d.matched.size(), std::size_t(2));
    QVERIFY(d.onlyA.empty() && d.onlyB.empty());
    QCOMPARE(d.verdict(), Change::Same);
    QVERIFY(!d.firstWorse);
    QVERIFY(d.suspects.empty());
    QVERIFY(d.worstMoves.empty());
    for (const LayerDiff& l : d.layers) {
        QCOMPARE(l.worseCells[0] + l.worseCells[1] + l.betterCells[0] + l.betterCells[1], std::int64_t(0));
        QVERIFY(l.statA == l.statB);
    }
}

void TestCaptureDiff::faultAtLayerIsReportedThere_data()
{
    QTest::addColumn<int>("seed");
    QTest::addColumn<int>("tp");
    QTest::addColumn<int>("fault");
    QTest::addColumn<int>("layer");
    // Partitioned: 4 KV heads over TP 2; replicated: 2 KV heads over TP 4.
    const FaultKind kinds[] = {FaultKind::HeadKScale, FaultKind::RopeOffset, FaultKind::KNegated};
    int row = 0;
    for (int seed : {11, 12, 13})
        for (int tp : {2, 4}) {
            const FaultKind kind = kinds[row % 3];
            const int layer = 1 + row % 4;
            QTest::addRow("seed %d, TP %d, %s at layer %d", seed, tp, faultName(kind).c_str(), layer)
                << seed << tp << int(kind) << layer;
            ++row;
        }
}

void TestCaptureDiff::faultAtLayerIsReportedThere()
{
    QFETCH(int, seed);
    QFETCH(int, tp);
    QFETCH(int, fault);
    QFETCH(int, layer);
    ModelCaptureOptions o = smallModel();
    o.seed = std::uint64_t(seed);
    o.tpSize = tp;
    o.shape.kvHeads = tp == 2 ? 4 : 2;
    const std::string tag = std::to_string(seed) + "_" + std::to_string(tp);
    const Capture a = capture(path("clean_" + tag + ".h5"), o);
    o.fault = FaultKind(fault);
    o.faultLayer = layer;
    const Capture b = capture(path("fault_" + tag + ".h5"), o);

    const DiffResult d = diffOf(a, b);
    QCOMPARE(d.verdict(), Change::Worse);
    QVERIFY(d.firstWorse);
    const std::string faultLayer = "model.layers." + std::to_string(layer) + ".self_attn";
    QCOMPARE(d.layerNamesB[std::size_t(d.firstWorse->layer)], faultLayer);
    QVERIFY(d.firstWorse->token >= 0);
    // Nothing before the fault's layer moved.
    for (const LayerDiff& l : d.layers)
        if (l.layer < layer)
            QCOMPARE(l.verdict(), Change::Same);
    QVERIFY(!d.suspects.empty());
    QCOMPARE(d.suspects.front().firstLayer, faultLayer);

    // The statistic (max) of each layer, recomputed in double from both analyses' metrics.
    for (const LayerDiff& l : d.layers)
        for (KvPart part : {KvPart::K, KvPart::V}) {
            double maxA = -1, maxB = -1;
            for (std::size_t p = 0; p < b.result.prompts.size(); ++p)
                for (std::int64_t t = 0; t < b.result.prompts[p].tokens; ++t) {
                    const double ra = referenceCellRatio(a.result.prompts[p], l.layer, t, part);
                    const double rb = referenceCellRatio(b.result.prompts[p], l.layer, t, part);
                    if (std::isfinite(ra) && std::isfinite(rb))
                        maxA = std::max(maxA, ra), maxB = std::max(maxB, rb);
                }
            QVERIFY2(std::fabs(l.statA[std::size_t(part)] - maxA) <= 1e-5 * maxA, l.name.c_str());
            QVERIFY2(std::fabs(l.statB[std::size_t(part)] - maxB) <= 1e-5 * maxB, l.name.c_str());
        }
}

void TestCaptureDiff::betterEverywhereIsNoWorse()
{
    ModelCaptureOptions o = smallModel(FaultKind::HeadKScale);
    o.faultLayer = 3;
    const Capture faulty = capture(path("better_a.h5"), o);
    const Capture clean = capture(path("better_b.h5"), smallModel());
    const DiffResult d = diffOf(faulty, clean);
    QVERIFY(d.verdict() != Change::Worse);
    QVERIFY(d.count(Change::Better) >= 1);
    QCOMPARE(d.layers[3].verdict(), Change::Better);
    QVERIFY(d.suspects.empty());
}

void TestCaptureDiff::analysisJsonStandsForA()
{
    const Capture a = capture(path("json_a.h5"), smallModel());
    ModelCaptureOptions o = smallModel(FaultKind::KNegated);
    o.faultLayer = 2;
    const Capture b = capture(path("json_b.h5"), o);
    {
        std::ofstream out(path("json_a.json"), std::ios::binary);
        writeAnalysisJson(a.result, out);
    }
    const DiffSide fromJson = readDiffSide(path("json_a.json"));
    const DiffSide direct = diffSideOf(a.result);
    QCOMPARE(fromJson.prompts.size(), direct.prompts.size());
    for (std::size_t p = 0; p < direct.prompts.size(); ++p) {
        QVERIFY(fromJson.prompts[p].inputIds == direct.prompts[p].inputIds);
        QVERIFY(fromJson.prompts[p].referenceHashes == direct.prompts[p].referenceHashes);
        for (std::size_t part = 0; part < 2; ++part) {  // floats read back bit-exactly (NaN as null)
            const auto& x = fromJson.prompts[p].ratios[part];
            const auto& y = direct.prompts[p].ratios[part];
            QCOMPARE(x.size(), y.size());
            for (std::size_t i = 0; i < x.size(); ++i)
                QVERIFY(x[i] == y[i] || (std::isnan(x[i]) && std::isnan(y[i])));
        }
    }
    std::ostringstream viaJson, viaBundle;
    writeDiffJson(diffAnalyses(fromJson, b.result, CaptureLoader(b.reader), {}), viaJson);
    writeDiffJson(diffAnalyses(direct, b.result, CaptureLoader(b.reader), {}), viaBundle);
    const nlohmann::json x = nlohmann::json::parse(viaJson.str()), y = nlohmann::json::parse(viaBundle.str());
    QVERIFY(x["a"]["kind"] == nlohmann::json("analysis"));
    QVERIFY(x["layers"] == y["layers"]);
    QVERIFY(x["suspects"] == y["suspects"]);
    QVERIFY(x["verdict"] == nlohmann::json("worse"));

    // An analysis without what diff needs says so, naming the file and the field.
    nlohmann::json old = nlohmann::json::parse(std::ifstream(path("json_a.json")));
    old["prompts"][0].erase("error_ratios");
    std::ofstream(path("old.json")) << old.dump();
    try {
        readDiffSide(path("old.json"));
        QFAIL("an analysis without error_ratios was read");
    } catch (const BundleError& e) {
        QVERIFY2(std::string(e.what()).find("old.json") != std::string::npos, e.what());
        QVERIFY2(std::string(e.what()).find("prompts[0].error_ratios") != std::string::npos, e.what());
    }
}

void TestCaptureDiff::capturesThatDoNotMatchAreRefused()
{
    const Capture a = capture(path("match_a.h5"), smallModel());
    ModelCaptureOptions other = smallModel();
    other.seed = 99;  // other tokens
    const Capture b = capture(path("match_b.h5"), other);
    QVERIFY_THROWS_EXCEPTION(DiffMismatch, diffOf(a, b));
    try {
        diffOf(a, b);
    } catch (const DiffMismatch& e) {
        QVERIFY2(std::string(e.what()).find("different prompts") != std::string::npos, e.what());
    }

    // The same tokens through another model: another reference.
    ModelCaptureOptions wider = smallModel();
    wider.shape.ffn = 192;
    const Capture c = capture(path("match_c.h5"), wider);
    QVERIFY(c.result.prompts[0].inputIds == a.result.prompts[0].inputIds);
    try {
        diffOf(a, c);
        QFAIL("captures against different references were compared");
    } catch (const DiffMismatch& e) {
        QVERIFY2(std::string(e.what()).find("different expected references") != std::string::npos, e.what());
    }

    // Three-way against two-way: other floors.
    ModelCaptureOptions twoWay = smallModel();
    twoWay.baseline = false;
    const Capture t = capture(path("match_t.h5"), twoWay);
    try {
        diffOf(a, t);
        QFAIL("a three-way and a two-way capture were compared");
    } catch (const DiffMismatch& e) {
        QVERIFY2(std::string(e.what()).find("two-way") != std::string::npos, e.what());
    }
}

void TestCaptureDiff::exitCodes()
{
    // The command's exit codes, for CI: 0 no worse, 1 worse (regressions listed first), 2 no match.
    const auto run = [](const QStringList& args, QString* out = nullptr) {
        QProcess p;
        p.start(KVSCOPE_BINARY, QStringList{"diff"} + args);
        p.waitForFinished(120000);
        if (out)
            *out = QString::fromUtf8(p.readAllStandardOutput() + p.readAllStandardError());
        return p.exitCode();
    };
    const QString a = QString::fromStdString(path("same_a.h5")), b = QString::fromStdString(path("same_b.h5"));
    QString text;
    QCOMPARE(run({a, b}), 0);
    QCOMPARE(run({QString::fromStdString(path("clean_11_2.h5")), QString::fromStdString(path("fault_11_2.h5")),
                  "--json", QString::fromStdString(path("d.json"))}, &text), 1);
    QVERIFY2(text.indexOf("REGRESSIONS") >= 0 && text.indexOf("REGRESSIONS") < text.indexOf("per layer ("), qPrintable(text));
    const nlohmann::json d = nlohmann::json::parse(std::ifstream(path("d.json")));
    QVERIFY(d["verdict"] == nlohmann::json("worse"));
    QVERIFY(d["regressions"][0]["layer"] == nlohmann::json("model.layers.1.self_attn"));
    QCOMPARE(run({QString::fromStdString(path("better_a.h5")), QString::fromStdString(path("better_b.h5"))}, &text), 0);
    QVERIFY2(text.contains("better in"), qPrintable(text));
    QCOMPARE(run({a, QString::fromStdString(path("match_b.h5"))}, &text), 2);
    QVERIFY2(text.contains("different prompts"), qPrintable(text));
    QCOMPARE(run({a, QString::fromStdString(path("missing.h5"))}), 2);
    QCOMPARE(run({a, b, "--stat", "mean"}, &text), 2);
    QCOMPARE(run({a, b, "--max-worse", "0.5"}), 2);
    QCOMPARE(run({a, b, "--stat", "median"}), 0);
}

void TestCaptureDiff::metricsWithoutBcAreTheSame()
{
    // diff analyses without the BCs: the metrics must be the very same bits.
    const auto reader = std::make_shared<BundleReader>(path("json_b.h5"));
    AnalysisOptions without;
    without.bcs.reset();
    const AnalysisResult full = analyzeBundle(reader), lean = analyzeBundle(reader, without);
    QVERIFY(full.aggregate && !lean.aggregate);
    for (std::size_t p = 0; p < full.prompts.size(); ++p) {
        for (int m = 0; m < kMetricCount; ++m) {
            const auto& x = full.prompts[p].metrics[std::size_t(m)];
            const auto& y = lean.prompts[p].metrics[std::size_t(m)];
            QCOMPARE(x.size(), y.size());
            QVERIFY(std::memcmp(x.data(), y.data(), x.size() * sizeof(float)) == 0);
        }
        for (const auto& bc : lean.prompts[p].bc)
            QVERIFY(std::all_of(bc.begin(), bc.end(), [](float v) { return std::isnan(v); }));
        QVERIFY(full.prompts[p].referenceHashes == lean.prompts[p].referenceHashes);
    }
}

void TestCaptureDiff::aSubsetOfLayersStandsForA()
{
    // A analysed over layers 0-2 only (kvscope analyze --layers 0-2): the reference is checked
    // over the layers both have, the others are listed, and the fault at layer 2 is found.
    const auto readerA = std::make_shared<BundleReader>(path("json_a.h5"));
    AnalysisOptions some;
    some.layers = {"model.layers.0.self_attn", "model.layers.1.self_attn", "model.layers.2.self_attn"};
    const AnalysisResult a = analyzeBundle(readerA, some);
    const auto readerB = std::make_shared<BundleReader>(path("json_b.h5"));
    const AnalysisResult b = analyzeBundle(readerB);
    const DiffResult d = diffAnalyses(diffSideOf(a), b, CaptureLoader(readerB), {});
    QCOMPARE(d.layersOnlyB.size(), b.prompts.front().layers.size() - 3);
    QCOMPARE(d.layers.size(), std::size_t(3));
    QCOMPARE(d.verdict(), Change::Worse);
    QCOMPARE(d.layerNamesB[std::size_t(d.firstWorse->layer)], std::string("model.layers.2.self_attn"));
}

void TestCaptureDiff::engineOnlyBIsComparedAgainstAsReference()
{
    const Capture a = capture(path("own_a.h5"), smallModel());
    ModelCaptureOptions o = smallModel(FaultKind::HeadKScale);
    o.faultLayer = 2;
    // The same faulty engine twice: with a reference of its own (the same bits as A's), and engine-only.
    const Capture withOwn = capture(path("own_b.h5"), o);
    o.engineOnly = true;
    writeModelCapture(path("engine_only_b.h5"), o);
    auto engineOnly = std::make_shared<BundleReader>(path("engine_only_b.h5"));
    QVERIFY(engineOnly->metadata().engineOnly);

    // On its own it cannot be analysed, and says why.
    const AnalysisResult alone = analyzeBundle(engineOnly);
    QVERIFY(!alone.problems.empty());
    for (const std::string& problem : alone.problems)
        QVERIFY2(problem.find("engine-only capture holds no reference KV") != std::string::npos, problem.c_str());

    // Against A's reference: the very analysis B gets with its own.
    AnalysisOptions options;
    options.searchSuspects = false;
    options.referenceDonor = a.reader;
    const AnalysisResult borrowed = analyzeForVerdict(engineOnly, options);
    QCOMPARE(borrowed.prompts.size(), withOwn.result.prompts.size());
    for (std::size_t p = 0; p < borrowed.prompts.size(); ++p) {
        QCOMPARE(borrowed.prompts[p].threeWay, true);
        for (std::size_t m = 0; m < borrowed.prompts[p].metrics.size(); ++m) {
            const auto& x = borrowed.prompts[p].metrics[m];
            const auto& y = withOwn.result.prompts[p].metrics[m];
            QCOMPARE(x.size(), y.size());
            QVERIFY(std::memcmp(x.data(), y.data(), x.size() * sizeof(float)) == 0);
        }
    }
    const DiffResult d = diffAnalyses(diffSideOf(a.result), borrowed,
                                      CaptureLoader(engineOnly, UnreadableBlockPolicy::Error, a.reader), {});
    QVERIFY(d.referenceFromA);
    QCOMPARE(d.verdict(), Change::Worse);
    QVERIFY(d.firstWorse);
    QCOMPARE(d.layerNamesB[std::size_t(d.firstWorse->layer)], std::string("model.layers.2.self_attn"));
    QVERIFY(!d.suspects.empty());
    QCOMPARE(d.suspects.front().firstLayer, std::string("model.layers.2.self_attn"));

    // A capture of other prompts lends nothing: each prompt names why.
    ModelCaptureOptions other = smallModel();
    other.seed = 99;
    writeModelCapture(path("other_donor.h5"), other);
    const CaptureLoader unmatched(engineOnly, UnreadableBlockPolicy::Error,
                                  std::make_shared<BundleReader>(path("other_donor.h5")));
    for (const PromptInfo& p : unmatched.prompts()) {
        QCOMPARE(p.problems.size(), std::size_t(1));
        QVERIFY2(p.problems.front().find("has its tokens to lend a reference") != std::string::npos, p.problems.front().c_str());
    }
    // A bundle with its own reference borrows none, even when offered one.
    const CaptureLoader own(withOwn.reader, UnreadableBlockPolicy::Error, a.reader);
    QCOMPARE(own.referenceOrigin(own.prompts().front().id), withOwn.reader->path());
}

void TestCaptureDiff::theChangesSuspectsSayTheStructure()
{
    // Damage at the first decode positions of exactly the prompts whose last block (8 positions
    // in the full layers) is at most half full, and damage stepping at prefill chunk 1's start:
    // B's suspects of the change say the structure with its statistic, the numbers from the
    // capture's ground truth.
    ModelCaptureOptions o = smallModel();
    o.promptLens = {24, 31, 26, 29, 20, 23};  // mod 8: 0, 7, 2, 5, 4, 7
    const Capture a = capture(path("structure_a.h5"), o);
    o.fault = FaultKind::LastBlockFill;
    o.faultLayer = 3;
    const Capture b = capture(path("fill_b.h5"), o);
    const nlohmann::json fill = nlohmann::json::parse(b.reader->metadata().extra.at("synthetic_fault"));
    DiffResult d = diffOf(a, b);
    QVERIFY(!d.suspects.empty());
    const Suspect& s = d.suspects.front();
    QVERIFY2(s.structure && s.structure->kind == "last_block_fill", s.evidence.c_str());
    QCOMPARE(s.structure->parameter("block_size"), fill.at("block_size").get<double>());
    QCOMPARE(s.structure->parameter("off_prompts"), double(fill.at("damaged_prompts").size()));
    QCOMPARE(s.structure->parameter("clean_prompts"), double(fill.at("spared_prompts").size()));
    QCOMPARE(s.structure->parameter("decode_positions"), fill.at("decode_positions").get<double>());
    QVERIFY2(s.evidence.find(s.structure->text) != std::string::npos, s.evidence.c_str());

    o.fault = FaultKind::ChunkBoundary;
    const Capture c = capture(path("chunk_b.h5"), o);
    const nlohmann::json chunk = nlohmann::json::parse(c.reader->metadata().extra.at("synthetic_fault"));
    d = diffOf(a, c);
    QVERIFY(!d.suspects.empty());
    const Suspect& t = d.suspects.front();
    QVERIFY2(t.structure && t.structure->kind == "chunk_boundary", t.evidence.c_str());
    QCOMPARE(t.structure->parameter("chunk"), 1.0);
    QCOMPARE(t.structure->parameter("boundary"), chunk.at("chunk_start").at(t.evidencePrompt).get<double>());
    QVERIFY2(t.evidence.find(t.structure->text) != std::string::npos, t.evidence.c_str());
}

QTEST_GUILESS_MAIN(TestCaptureDiff)
#include "tst_capture_diff.moc"
