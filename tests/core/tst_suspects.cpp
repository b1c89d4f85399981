// Suspects on captures of the small model with each fault injected (its ground truth in the
// bundle), over seeds, both TP modes, both sliding-window spec types, the fault in a sliding
// and in a full layer, in prefill and in decode, three-way and two-way: the top suspect has
// the right pattern and names the injected layer, head, rank or block; clean captures give
// none. The confusion table (injected fault x top pattern) is printed.

#include "analysis/analysis_json.h"
#include "analysis/analyzer.h"
#include "analysis/suspect_search.h"
#include "synth/model_capture.h"

#include <nlohmann/json.hpp>

#include <QTemporaryDir>
#include <QTest>

#include <map>
#include <sstream>

using namespace kvscope;
using namespace kvscope::synth;

namespace {

enum class Tp { Partitioned, Replicated };

ModelCaptureOptions shape(Tp tp, bool slidingSpec, std::uint64_t seed)
{
    ModelCaptureOptions o;
    o.shape.layers = 6;
    o.shape.hidden = 64;
    o.shape.queryHeads = 8;
    o.shape.kvHeads = tp == Tp::Partitioned ? 8 : 2;  // 2 heads per rank of 4, or each head on 2 ranks
    o.shape.headDim = 16;
    o.shape.ffn = 128;
    o.shape.window = 12;
    o.tpSize = 4;
    o.slidingWindowSpec = slidingSpec;
    o.promptLens = {24, 32};
    o.decodeTokens = 16;
    o.seed = seed;
    return o;
}

std::string layerName(int l)
{
    return "model.layers." + std::to_string(l) + ".self_attn";
}

}  // namespace

class TestSuspects : public QObject {
    Q_OBJECT

private slots:
    void init();
    void injectedFaultsAreNamed();
    void twoWayCapturesToo();
    void cleanCapturesHaveNone();
    void jsonCarriesTheSuspects();
    void cleanupTestCase();

private:
    struct Run {
        AnalysisResult result;
        nlohmann::json truth;
    };
    Run run(const ModelCaptureOptions& o)
    {
        const std::string path = m_dir.filePath(QString("c%1.h5").arg(m_count++)).toStdString();
        writeModelCapture(path, o);
        auto reader = std::make_shared<BundleReader>(path);
        Run r{analyzeBundle(reader), nlohmann::json::parse(reader->metadata().extra.at("synthetic_fault"))};
        std::remove(path.c_str());
        return r;
    }
    // Checks the top suspect of the bundle against the truth; records the confusion.
    void check(const ModelCaptureOptions& o, const QString& what);

    QTemporaryDir m_dir;
    int m_count = 0;
    std::map<std::string, std::map<std::string, int>> m_confusion;  // injected -> top pattern -> count
    QStringList m_failures;
};

void TestSuspects::check(const ModelCaptureOptions& o, const QString& what)
{
    const Run r = run(o);
    const std::string fault = faultName(o.fault);
    const std::vector<Suspect>& all = r.result.suspects;
    const std::string top = all.empty() ? "none" : suspectPatternName(all.front().pattern);
    ++m_confusion[fault][top];
    QStringList wrong;
    auto expect = [&](bool ok, const QString& message) {
        if (!ok)
            wrong << message;
    };
    if (all.empty()) {
        expect(o.fault == FaultKind::None, "no suspect");
    } else {
        const Suspect& s = all.front();
        const int layer = o.faultLayer;
        switch (o.fault) {
        case FaultKind::None:
            expect(false, "a suspect on a clean capture: " + QString::fromStdString(s.evidence));
            break;
        case FaultKind::RopeOffset:
            expect(top == "position", "pattern " + QString::fromStdString(top));
            expect(s.firstLayer == layerName(layer), "first layer " + QString::fromStdString(s.firstLayer));
            expect(s.kv == "k" && s.phase == "decode", "kv/phase " + QString::fromStdString(s.kv + "/" + s.phase));
            break;
        case FaultKind::DeadHead:
            expect(top == "head", "pattern " + QString::fromStdString(top));
            expect(s.firstLayer == layerName(layer), "first layer " + QString::fromStdString(s.firstLayer));
            expect(s.heads == std::vector<int>{o.faultHead}, "heads");
            expect(o.faultStep >= 0 ? s.phase == "decode" : s.phase == "both", "phase " + QString::fromStdString(s.phase));
            // The ranks that hold the head: rank head / 2 (partitioned), or ranks 2h, 2h + 1.
            expect(o.shape.kvHeads == 8 ? s.tpRanks == std::vector<int>{o.faultHead / 2}
                                        : s.tpRanks == std::vector<int>{2 * o.faultHead, 2 * o.faultHead + 1},
                   "tp ranks");
            break;
        case FaultKind::Fp8Scale:
            expect(top == "layer", "pattern " + QString::fromStdString(top));
            expect(s.firstLayer == layerName(layer), "first layer " + QString::fromStdString(s.firstLayer));
            expect(int(s.heads.size()) == o.shape.kvHeads, "every head");
            break;
        case FaultKind::ShardSwap:
            expect(s.firstLayer == layerName(layer), "first layer " + QString::fromStdString(s.firstLayer));
            if (o.shape.kvHeads == 8) {
                // Ranks 1 and 2 hold heads 2-5.
                expect(top == "tp_rank", "pattern " + QString::fromStdString(top));
                expect(s.tpRanks == std::vector<int>({1, 2}), "tp ranks");
                expect(s.heads == std::vector<int>({2, 3, 4, 5}), "heads");
            } else {
                // Replicated: rank 1 holds head 0, rank 2 head 1, and head 1 is read from rank 2,
                // which now holds rank 1's shard: head 1 is wrong, read from rank 2.
                expect(top == "head" || top == "tp_rank", "pattern " + QString::fromStdString(top));
                expect(s.heads == std::vector<int>{1}, "heads");
                expect(std::find(s.tpRanks.begin(), s.tpRanks.end(), 2) != s.tpRanks.end(), "rank 2 named");
            }
            break;
        case FaultKind::StaleBlock: {
            expect(top == "block", "pattern " + QString::fromStdString(top));
            const int group = r.truth.at("group").get<int>();
            const std::int64_t logical = r.truth.at("logical_block").get<std::int64_t>();
            const std::int64_t stale = r.truth.at("stale_block").get<std::int64_t>();
            expect(std::any_of(s.blocks.begin(), s.blocks.end(),
                               [&](const SuspectBlock& b) { return b.group == group && b.logical == logical && b.physical == stale; }),
                   QString("block (group %1, logical %2, physical %3) not named").arg(group).arg(logical).arg(stale));
            expect(s.prompts == std::vector<std::string>{"prompt_0"}, "prompts");
            const auto positions = r.truth.at("positions");
            expect(s.firstToken >= positions[0].get<std::int64_t>() && s.lastToken <= positions[1].get<std::int64_t>() + 1,
                   QString("tokens %1-%2").arg(s.firstToken).arg(s.lastToken));
            break;
        }
        case FaultKind::WindowOffByOne:
            expect(top == "window_edge", "pattern " + QString::fromStdString(top));
            expect(s.firstLayer == layerName(1), "first layer " + QString::fromStdString(s.firstLayer));
            break;
        }
    }
    if (!wrong.isEmpty())
        m_failures << what + ": " + wrong.join("; ") +
                          (all.empty() ? QString() : " [" + QString::fromStdString(all.front().evidence) + "]");
}

void TestSuspects::init()
{
    m_failures.clear();
}

void TestSuspects::injectedFaultsAreNamed()
{
    for (std::uint64_t seed : {1u, 2u, 3u})
        for (Tp tp : {Tp::Partitioned, Tp::Replicated})
            for (bool slidingSpec : {true, false}) {
                const QString where = QString("seed %1, %2, %3 spec")
                                          .arg(seed)
                                          .arg(tp == Tp::Partitioned ? "partitioned" : "replicated")
                                          .arg(slidingSpec ? "sliding" : "full");
                for (int layer : {2, 3}) {  // a sliding-window layer, a full-attention layer
                    for (FaultKind kind : {FaultKind::RopeOffset, FaultKind::DeadHead, FaultKind::Fp8Scale,
                                           FaultKind::ShardSwap, FaultKind::StaleBlock}) {
                        ModelCaptureOptions o = shape(tp, slidingSpec, seed);
                        o.fault = kind;
                        o.faultLayer = layer;
                        o.faultHead = 1;
                        o.faultRank = 1;
                        // Late enough that a sliding-window layer still holds the position.
                        o.faultStep = 10;
                        check(o, QString("%1, layer %2, %3").arg(where).arg(layer).arg(QString::fromStdString(faultName(kind))));
                    }
                    // In the prefill (of a full-attention layer: a sliding window has dropped it by
                    // the end; later layers show a sliding layer's prefill faults).
                    for (FaultKind kind : {FaultKind::DeadHead, FaultKind::StaleBlock}) {
                        if (layer == 2)
                            continue;
                        ModelCaptureOptions o = shape(tp, slidingSpec, seed);
                        o.fault = kind;
                        o.faultLayer = layer;
                        o.faultHead = 1;
                        o.faultStep = -10;
                        check(o, QString("%1, layer %2, %3 in the prefill").arg(where).arg(layer).arg(QString::fromStdString(faultName(kind))));
                    }
                }
                ModelCaptureOptions o = shape(tp, slidingSpec, seed);
                o.fault = FaultKind::WindowOffByOne;
                check(o, where + ", window_off_by_one");
            }
    QVERIFY2(m_failures.isEmpty(), qPrintable(QString("%1 wrong:\n").arg(m_failures.size()) + m_failures.join("\n")));
}

void TestSuspects::twoWayCapturesToo()
{
    for (std::uint64_t seed : {1u, 2u})
        for (FaultKind kind : {FaultKind::RopeOffset, FaultKind::DeadHead, FaultKind::Fp8Scale, FaultKind::ShardSwap,
                               FaultKind::StaleBlock, FaultKind::None}) {
            ModelCaptureOptions o = shape(Tp::Partitioned, true, seed);
            o.baseline = false;
            o.fault = kind;
            o.faultLayer = 3;
            o.faultHead = 1;
            o.faultRank = 1;
            o.faultStep = 5;
            check(o, QString("two-way, seed %1, %2").arg(seed).arg(QString::fromStdString(faultName(kind))));
        }
    QVERIFY2(m_failures.isEmpty(), qPrintable(QString("%1 wrong:\n").arg(m_failures.size()) + m_failures.join("\n")));
}

void TestSuspects::cleanCapturesHaveNone()
{
    for (std::uint64_t seed : {1u, 2u, 3u, 4u})
        for (Tp tp : {Tp::Partitioned, Tp::Replicated})
            for (bool slidingSpec : {true, false}) {
                ModelCaptureOptions o = shape(tp, slidingSpec, seed);
                check(o, QString("clean, seed %1").arg(seed));
            }
    // And a longer one, and one with an fp8 cache (noisier everywhere, but no fault).
    ModelCaptureOptions longer = shape(Tp::Partitioned, true, 5);
    longer.promptLens = {80, 120};
    longer.decodeTokens = 40;
    check(longer, "clean, longer prompts");
    ModelCaptureOptions fp8 = shape(Tp::Partitioned, true, 6);
    fp8.fp8Cache = true;
    check(fp8, "clean, fp8 cache");
    QVERIFY2(m_failures.isEmpty(), qPrintable(QString("%1 wrong:\n").arg(m_failures.size()) + m_failures.join("\n")));
}

void TestSuspects::jsonCarriesTheSuspects()
{
    ModelCaptureOptions o = shape(Tp::Partitioned, true, 1);
    o.fault = FaultKind::StaleBlock;
    o.faultLayer = 3;
    o.faultStep = 10;
    const Run r = run(o);
    std::ostringstream text;
    writeAnalysisJson(r.result, text);
    const nlohmann::json json = nlohmann::json::parse(text.str());
    const char* fields[] = {"pattern", "score", "evidence", "prompts", "first_layer", "layers", "kv",
                            "heads", "tp_ranks", "tokens", "phase", "blocks", "worst_cell"};
    QCOMPARE(json.at("suspects").size(), std::size_t(1));
    const nlohmann::json& top = json.at("suspects")[0];
    for (const char* field : fields)
        QVERIFY2(top.contains(field), field);  // never missing
    QCOMPARE(top.at("pattern").get<std::string>(), std::string("block"));
    QCOMPARE(top.at("first_layer").get<std::string>(), layerName(1));  // the group's first layer
    QCOMPARE(top.at("blocks")[0].at("logical").get<std::int64_t>(), r.truth.at("logical_block").get<std::int64_t>());
    QCOMPARE(top.at("blocks")[0].at("physical").get<std::int64_t>(), r.truth.at("stale_block").get<std::int64_t>());
    QVERIFY(top.at("prompts") == nlohmann::json::array({"prompt_0"}));
    // Per prompt: the faulty prompt has it, the other an empty list.
    QCOMPARE(json.at("prompts")[0].at("suspects").size(), std::size_t(1));
    QVERIFY(json.at("prompts")[1].at("suspects").is_array() && json.at("prompts")[1].at("suspects").empty());
}

void TestSuspects::cleanupTestCase()
{
    // The confusion table, for the record.
    QString table = "\ninjected fault        top suspect pattern (count)\n";
    for (const auto& [fault, row] : m_confusion) {
        table += QString::fromStdString(fault).leftJustified(22);
        for (const auto& [pattern, count] : row)
            table += QString("%1 %2   ").arg(QString::fromStdString(pattern)).arg(count);
        table += "\n";
    }
    qInfo("%s", qPrintable(table));
}

QTEST_APPLESS_MAIN(TestSuspects)
#include "tst_suspects.moc"
