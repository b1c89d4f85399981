// Suspects on the synthetic catalogue: captures of the small model with each fault kind
// injected (its ground truth in the bundle), over seeds, both TP modes, both sliding-window
// spec types, the fault in a sliding and in a full layer, three-way and two-way. The top
// suspect must name the right explanation (hypothesis) and the right place (layer, head, rank,
// block or tokens), as the ground truth says; clean captures (fp8 caches, long prompts, 80
// layers, two-way) must give none.
//
// The kinds are split: the suspects were tuned on the first half; the second half is the
// held-out score. Both are printed with the confusion table (docs/suspects.md keeps them).

#include "analysis/analysis_fields.h"
#include "analysis/analysis_json.h"
#include "analysis/analyzer.h"
#include "analysis/hypotheses.h"
#include "analysis/off_floor.h"
#include "analysis/page_rereads.h"
#include "analysis/suspect_search.h"
#include "analysis/threshold_check.h"
#include "analysis/worst_cells.h"
#include "format/json_fields.h"
#include "kv/block_layout.h"
#include "kv/replica_check.h"
#include "synth/model_capture.h"

#include "hand_layer.h"

#include <nlohmann/json.hpp>

#include <QTemporaryDir>
#include <QTest>

#include <cmath>
#include <map>
#include <set>
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

// The kinds the suspects were tuned on, and the held-out ones.
const std::set<FaultKind> kTuned = {FaultKind::RopeOffset, FaultKind::DeadHead,   FaultKind::WindowOffByOne,
                                    FaultKind::RopePrefill, FaultKind::StaleBlock, FaultKind::ShardSwap,
                                    FaultKind::Fp8Scale,   FaultKind::RankVScale, FaultKind::HeadSwap,
                                    FaultKind::BlockShift, FaultKind::ScaleGranularity, FaultKind::ScaleOtherLayer,
                                    // KV from elsewhere and windows of the wrong type (#54): half tuned on,
                                    FaultKind::OtherLayer, FaultKind::WindowShort};

// Kinds added after the rules were settled and run once: a second held-out score.
const std::set<FaultKind> kLater = {FaultKind::HeadKScale, FaultKind::LaggingWrite, FaultKind::RankUnwritten,
                                    FaultKind::KNegated};

// ... half held out, run once after the tuning on the other half: a third held-out score.
const std::set<FaultKind> kLater3 = {FaultKind::OtherPrompt, FaultKind::WindowOnFull};

// Layouts read wrong and structural faults (#54, points 4 and 5): half tuned on (kTuned4), the
// other half held out and run once after the tuning: a fourth held-out score.
const std::set<FaultKind> kTuned4 = {FaultKind::LayoutTokenMajor};
const std::set<FaultKind> kLater4 = {FaultKind::LayoutKvHalves};

// Damage that follows the engine's structure (#54, point 5): the last block's fill tuned on
// (kTuned5), the chunk boundary held out and run once: a fifth held-out score.
const std::set<FaultKind> kTuned5 = {FaultKind::LastBlockFill};
const std::set<FaultKind> kLater5 = {FaultKind::ChunkBoundary};

// GQA replicas holding the wrong head and the cache's page order misread (#54, points 4 and 5):
// a read rank holding another head (the shard swap look-alike) tuned on (kTuned6); a replica
// holding another head and K/V-first pages read blocks-first held out, run once: a sixth
// held-out score.
const std::set<FaultKind> kTuned6 = {FaultKind::ReadRankWrongHead};
const std::set<FaultKind> kLater6 = {FaultKind::ReplicaWrongHead, FaultKind::LayoutBlocksFirst};

const char* halfOf(FaultKind k)
{
    const std::vector<FaultKind> magnitude = magnitudeFaultKinds();
    if (std::find(magnitude.begin(), magnitude.end(), k) != magnitude.end())
        return "magnitude";  // magnitudeFaults, apart from the catalogue's scores
    return kTuned.count(k) ? "tuned" : kLater.count(k) ? "held-out-2" : kLater3.count(k) ? "held-out-3"
         : kTuned4.count(k) ? "tuned-4" : kLater4.count(k) ? "held-out-4" : kTuned5.count(k) ? "tuned-5"
         : kLater5.count(k) ? "held-out-5" : kTuned6.count(k) ? "tuned-6" : kLater6.count(k) ? "held-out-6" : "held-out";
}

// Kinds that touch every layer (the fault layer means nothing), and kinds confined to the
// prefill or the first decode positions (a sliding-window layer has dropped those by the end).
bool everyLayer(FaultKind k)
{
    return k == FaultKind::WindowOffByOne || k == FaultKind::ChunkedPrefill || k == FaultKind::RopeScaling ||
           k == FaultKind::RankVScale || k == FaultKind::GlobalVScale || k == FaultKind::LostWrite ||
           k == FaultKind::BatchMixup || k == FaultKind::OtherPrompt || k == FaultKind::WindowShort ||
           k == FaultKind::WindowOnFull;
}
bool prefillOnly(FaultKind k)
{
    return k == FaultKind::RopePrefill || k == FaultKind::ChunkBoundary || k == FaultKind::LastBlockFill;
}

// The first layer of the KV cache group of `layer` (even layers slide, odd ones are full).
int groupStart(int layer)
{
    return layer % 2;
}

}  // namespace

class TestSuspects : public QObject {
    Q_OBJECT

private slots:
    void init();
    void catalogueThreeWay();
    void catalogueTwoWay();
    void cleanCapturesHaveNone();
    void llama3ScaledRope();
    void aFaultInEveryCellIsFound();
    void quantisedCaches();
    void jsonCarriesTheSuspects();
    void noiseCountIsPoisson();
    void nonFiniteIsNamedFirst();
    void nonFiniteHandMade();
    void checkNamesAPooledSuspectByItsEvidencePrompt();
    void labelsFollowTheHypothesis();
    void magnitudeFaults();
    void cachePageOrders();
    void replicasHoldingAnotherHead();
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
    // What is wrong with the top suspect of `r` for the injected fault (empty: right).
    QStringList judge(const ModelCaptureOptions& o, const Run& r) const;
    // Runs one capture, judges it, records the confusion and the score.
    void check(const ModelCaptureOptions& o, const QString& what);
    // Every prompt's suspect: a hypothesis it offers clearly lowers the error (clearlyLowers,
    // but `unrelated`, whose claim is that nothing is near); an unexplained one says what was
    // measured, an explained one does not. Broken rules go to m_leads.
    void checkLeads(const Run& r, const QString& what);
    void runCatalogue(bool threeWay);

    QTemporaryDir m_dir;
    int m_count = 0;
    std::map<std::string, std::map<std::string, int>> m_confusion;  // injected -> top pattern/hypothesis -> count
    std::map<std::string, std::pair<int, int>> m_score;             // half -> (right, all)
    QStringList m_failures;
    QStringList m_unseen;  // faulty captures without any suspect
    QStringList m_leads;   // suspects breaking checkLeads' rules
    int m_measured = 0;    // unexplained suspects that say what was measured
};

QStringList TestSuspects::judge(const ModelCaptureOptions& o, const Run& r) const
{
    QStringList wrong;
    const auto expect = [&](bool ok, const QString& message) {
        if (!ok)
            wrong << message;
    };
    const std::vector<Suspect>& all = r.result.suspects;
    if (o.fault == FaultKind::None) {
        expect(all.empty(), all.empty() ? QString() : "a suspect on a clean capture: " + QString::fromStdString(all.front().evidence));
        return wrong;
    }
    if (all.empty())
        return {"no suspect"};
    const Suspect& s = all.front();
    // Tokens are the evidence prompt's own (the pooled suspect's span every prompt).
    Suspect own = s;
    for (const PromptAnalysis& p : r.result.prompts)
        if (p.id == s.evidencePrompt && !p.suspects.empty())
            own = p.suspects.front();
    const std::string pattern = suspectPatternName(s.pattern);
    const std::string kind = s.hypothesis.kind;
    const auto is = [&](const std::string& expected) {
        expect(kind == expected, QString("hypothesis %1, not %2").arg(QString::fromStdString(kind), QString::fromStdString(expected)));
    };
    const auto patternIn = [&](std::initializer_list<const char*> allowed) {
        bool ok = false;
        for (const char* a : allowed)
            ok = ok || pattern == a;
        expect(ok, "pattern " + QString::fromStdString(pattern));
    };
    const auto layerIs = [&](int l) {
        expect(s.firstLayer == layerName(l), "first layer " + QString::fromStdString(s.firstLayer) + ", not " +
                                                 QString::fromStdString(layerName(l)));
    };
    const auto near = [](double x, double target) { return std::fabs(x - target) <= 0.05 * std::fabs(target); };
    const bool partitioned = o.shape.kvHeads >= o.tpSize;
    const int L = o.faultLayer;
    switch (o.fault) {
    case FaultKind::None:
        break;
    case FaultKind::RopeOffset:
        is("rope_offset");
        expect(s.hypothesis.parameter("offset") == 1, "offset");
        patternIn({"position"});
        layerIs(L);
        expect(s.kv == "k" && s.phase == "decode", "kv/phase " + QString::fromStdString(s.kv + "/" + s.phase));
        break;
    case FaultKind::RopePrefill:
        is("rope_offset");
        expect(s.hypothesis.parameter("offset") == 3, "offset");
        patternIn({"position"});
        layerIs(L);
        expect(s.phase == "prefill", "phase " + QString::fromStdString(s.phase));
        break;
    case FaultKind::ChunkedPrefill: {
        // Positions restart at the middle of the evidence prompt (rounded down to 4).
        is("rope_offset");
        const std::int64_t len = s.evidencePrompt == "prompt_0" ? o.promptLens[0] : o.promptLens[1];
        const std::int64_t restart = std::max<std::int64_t>(4, len / 2 / 4 * 4);
        expect(s.hypothesis.parameter("offset") == -double(restart), QString("offset, not -%1").arg(restart));
        layerIs(0);
        break;
    }
    case FaultKind::RopeScaling:
        is("rope_scaling");
        expect(s.hypothesis.parameter("factor") == 2, "factor");
        layerIs(0);
        break;
    case FaultKind::RopeConvention:
        is("rope_convention");
        layerIs(L);
        break;
    case FaultKind::PartialRotary:
        is("rope_dims");
        expect(s.hypothesis.parameter("rotary_dims") == o.shape.headDim / 2, "rotary dims");
        layerIs(L);
        break;
    case FaultKind::DeadHead:
        is("zeros");
        patternIn({"head"});
        layerIs(L);
        expect(s.heads == std::vector<int>{o.faultHead}, "heads");
        break;
    case FaultKind::WindowOffByOne:
        patternIn({"window_edge"});
        expect(s.firstToken >= o.shape.window - 2 && s.firstToken <= o.shape.window + 1,
               QString("first token %1").arg(s.firstToken));
        break;
    case FaultKind::StaleBlock:
    case FaultKind::PrefixReuse: {
        is("unrelated");
        patternIn({"block"});
        layerIs(groupStart(L));
        expect(s.prompts == std::vector<std::string>{"prompt_0"}, "prompts");
        if (o.fault == FaultKind::StaleBlock) {
            const int group = r.truth.at("group").get<int>();
            const std::int64_t logical = r.truth.at("logical_block").get<std::int64_t>();
            const std::int64_t stale = r.truth.at("stale_block").get<std::int64_t>();
            expect(std::any_of(s.blocks.begin(), s.blocks.end(),
                               [&](const SuspectBlock& b) { return b.group == group && b.logical == logical && b.physical == stale; }),
                   QString("block (group %1, logical %2, physical %3) not named").arg(group).arg(logical).arg(stale));
        }
        break;
    }
    case FaultKind::ShardSwap:
        layerIs(L);
        if (partitioned) {
            is("rank_swap");
            patternIn({"tp_rank"});
            expect(s.tpRanks == std::vector<int>({1, 2}), "tp ranks");
        } else {
            // Replicated: rank 1 holds head 0, rank 2 head 1, and head 1 is read from rank 2,
            // which now holds rank 1's shard: head 1 holds head 0.
            is("head_swap");
            patternIn({"head"});
            expect(s.hypothesis.parameter("head_1") == 0, "head 1 holds head 0");
        }
        break;
    case FaultKind::Fp8Scale:
        // Per token and head, the declared scales are the token's own: a factor is all there is.
        is(o.kvScale == ScaleGranularity::TokenHead ? "scale" : "cache_scale");
        expect(near(s.hypothesis.parameter("factor"), 2.0), "factor");
        layerIs(L);
        break;
    case FaultKind::ScaleGranularity:
        is("scale_granularity");
        layerIs(L);
        break;
    case FaultKind::ScaleOtherLayer:
        is("scale_other_layer");
        layerIs(L);
        break;
    case FaultKind::RankVScale:
        is("scale");
        expect(near(s.hypothesis.parameter("factor"), 1.25), "factor");
        layerIs(0);
        expect(s.kv == "v", "kv " + QString::fromStdString(s.kv));
        expect(partitioned ? s.heads == std::vector<int>({2, 3}) : s.heads == std::vector<int>({0}),
               "heads of rank 1");
        break;
    case FaultKind::GlobalVScale:
        is("scale");
        expect(near(s.hypothesis.parameter("factor"), 0.8), "factor");
        layerIs(0);
        expect(s.kv == "v", "kv " + QString::fromStdString(s.kv));
        break;
    case FaultKind::HeadSwap: {
        is("head_swap");
        patternIn({"head"});  // the map names heads, whichever ranks hold them
        layerIs(L);
        const int other = (o.faultHead ^ 1) < o.shape.kvHeads ? o.faultHead ^ 1 : o.faultHead - 1;
        expect(s.hypothesis.parameter("head_" + std::to_string(o.faultHead)) == other, "mapping");
        break;
    }
    case FaultKind::KvSwap:
        is("kv_swap");
        layerIs(L);
        break;
    case FaultKind::BlockShift: {
        is("token_shift");
        const int blockSize = groupStart(L) == 0 ? o.slidingBlockSize : o.fullBlockSize;
        expect(s.hypothesis.parameter("offset") == -blockSize, QString("offset, not -%1").arg(blockSize));
        layerIs(groupStart(L));
        break;
    }
    case FaultKind::LostWrite:
        is("zeros");
        patternIn({"position"});
        layerIs(0);
        expect(own.firstToken == own.lastToken, "one position");
        break;
    case FaultKind::HeadKScale:
        is("scale");
        expect(near(s.hypothesis.parameter("factor"), 0.5), "factor");
        patternIn({"head"});
        layerIs(L);
        expect(s.heads == std::vector<int>{o.faultHead} && s.kv == "k", "head and part");
        break;
    case FaultKind::LaggingWrite:
        is("token_shift");
        expect(s.hypothesis.parameter("offset") == -1, "offset");
        patternIn({"position"});
        layerIs(L);
        break;
    case FaultKind::RankUnwritten:
        is("zeros");
        layerIs(L);
        if (partitioned) {
            patternIn({"tp_rank"});
            expect(s.tpRanks == std::vector<int>{1}, "tp ranks");
        } else {
            expect(s.heads == std::vector<int>{0}, "heads of rank 1");
        }
        break;
    case FaultKind::KNegated:
        is("scale");
        expect(near(s.hypothesis.parameter("factor"), -1.0), "factor");
        layerIs(L);
        expect(s.kv == "k", "kv " + QString::fromStdString(s.kv));
        break;
    case FaultKind::TokenScale:
        is("token_scale");
        layerIs(L);
        expect(s.kv == "k", "kv " + QString::fromStdString(s.kv));
        break;
    case FaultKind::ChannelScale:
        is("channel_scale");
        layerIs(L);
        expect(s.heads == std::vector<int>{o.faultHead} && s.kv == "v", "head and part");
        break;
    case FaultKind::QkvBias:
        is("bias");
        layerIs(L);
        expect(s.heads == std::vector<int>{o.faultHead}, "heads");
        break;
    case FaultKind::Clipped:
        is("clipped");
        layerIs(L);
        expect(s.kv == "k" && s.hypothesis.parameter("bound") == r.truth.at("bound").get<double>(), "part and bound");
        break;
    case FaultKind::BatchMixup:
        is("unrelated");
        patternIn({"position"});
        layerIs(0);
        expect(s.prompts == std::vector<std::string>{"prompt_0"}, "prompts");
        break;
    case FaultKind::OtherLayer:
        // Layer L holds layer L - 1's KV: the whole layer, named with the layer it came from.
        is("other_layer");
        patternIn({"layer"});
        layerIs(L);
        expect(s.hypothesis.parameter("layer") == L - 1, "source layer");
        break;
    case FaultKind::OtherPrompt:
        // prompt_1's first block holds prompt_0's, in the full layers (the sliding ones' reference
        // no longer holds it): a block of the full group, the same positions of prompt_0.
        is("other_prompt");
        patternIn({"block"});
        layerIs(1);
        expect(s.prompts == std::vector<std::string>{"prompt_1"}, "prompts");
        expect(s.hypothesis.parameter("prompt_index") == 0 && s.hypothesis.parameter("offset") == 0, "source prompt and offset");
        expect(own.firstToken == 0 && own.lastToken == o.fullBlockSize - 1,
               QString("positions %1-%2").arg(own.firstToken).arg(own.lastToken));
        break;
    case FaultKind::WindowShort:
        // The reference keeps window - 1 positions of a sliding layer; the engine one fewer.
        is("window_mismatch");
        patternIn({"window_edge"});
        layerIs(0);
        expect(s.hypothesis.parameter("sliding") == 1 && s.hypothesis.parameter("kept") == o.shape.window - 2 &&
                   s.hypothesis.parameter("reference_kept") == o.shape.window - 1,
               QString("kept %1 of %2").arg(s.hypothesis.parameter("kept")).arg(s.hypothesis.parameter("reference_kept")));
        break;
    case FaultKind::WindowOnFull:
        is("window_mismatch");
        patternIn({"window_edge"});
        layerIs(1);
        expect(s.hypothesis.parameter("sliding") == 0 && s.hypothesis.parameter("kept") == o.shape.window,
               QString("kept %1").arg(s.hypothesis.parameter("kept")));
        break;
    case FaultKind::ReplicaWrongHead:
    case FaultKind::ReadRankWrongHead:
        // The rank holding another head, named with the head it holds and the one it should,
        // whether it is the copy read (the merged cache off: a head map, or a shard swap, in
        // look) or a replica (the merged cache right).
        is("replica_head");
        patternIn({"tp_rank"});
        layerIs(L);
        expect(s.tpRanks == std::vector<int>{r.truth.at("rank").get<int>()} &&
                   s.heads == std::vector<int>{r.truth.at("should_hold_head").get<int>()},
               "rank and head");
        expect(s.hypothesis.parameter("holds_head") == r.truth.at("holds_head").get<double>() &&
                   s.hypothesis.parameter("should_hold_head") == r.truth.at("should_hold_head").get<double>() &&
                   s.hypothesis.parameter("replica_rank") == r.truth.at("replica_rank").get<double>() &&
                   s.hypothesis.parameter("read") == (r.truth.at("read").get<bool>() ? 1.0 : 0.0),
               "held and right heads");
        break;
    case FaultKind::LayoutTokenMajor:
    case FaultKind::LayoutKvHalves:
    case FaultKind::LayoutBlocksFirst:
        // The whole layer's blocks misread: named with what was read as what.
        is("layout");
        patternIn({"layer"});
        layerIs(L);
        // Named as injected, or as a layout that is the same bytes at this shape (one head a
        // rank: K and V split head-major and token-major are one order).
        expect((s.hypothesis.label("written_as") == r.truth.at("written_as").get<std::string>() &&
                s.hypothesis.label("read_as") == r.truth.at("read_as").get<std::string>()) ||
                   (", " + s.hypothesis.label("same_bytes_as") + ",")
                           .find(", " + r.truth.at("written_as").get<std::string>() + "/" +
                                 r.truth.at("read_as").get<std::string>() + ",") != std::string::npos,
               QString("written %1, read %2").arg(QString::fromStdString(s.hypothesis.label("written_as")),
                                                  QString::fromStdString(s.hypothesis.label("read_as"))));
        break;
    case FaultKind::LastBlockFill:
        // The values: 0.5x at the first decode positions; the structure: exactly the prompts whose
        // last block was at most half full, across the capture's prompts.
        is("scale");
        expect(near(s.hypothesis.parameter("factor"), 0.5), "factor");
        patternIn({"position"});
        layerIs(L);
        expect(s.structure && s.structure->kind == "last_block_fill" &&
                   s.structure->parameter("block_size") == r.truth.at("block_size").get<double>() &&
                   s.structure->parameter("off_prompts") == double(r.truth.at("damaged_prompts").size()) &&
                   s.structure->parameter("clean_prompts") == double(r.truth.at("spared_prompts").size()) &&
                   s.structure->parameter("decode_positions") == r.truth.at("decode_positions").get<double>(),
               "structure " + QString::fromStdString(s.structure ? s.structure->text : "none"));
        break;
    case FaultKind::ChunkBoundary:
        // The values: 0.75x from chunk 1 on; the structure: the step at that chunk's first position.
        is("scale");
        expect(near(s.hypothesis.parameter("factor"), 0.75), "factor");
        patternIn({"position"});
        layerIs(L);
        expect(s.structure && s.structure->kind == "chunk_boundary" && s.structure->parameter("chunk") == 1 &&
                   s.structure->parameter("boundary") == r.truth.at("chunk_start").at(s.evidencePrompt).get<double>(),
               "structure " + QString::fromStdString(s.structure ? s.structure->text : "none"));
        break;
    case FaultKind::Nan:
    case FaultKind::Inf:
    case FaultKind::NanExpected: {
        // Named first, whatever else is off: the layer, head, part, token, and the side holding it.
        is("non_finite");
        patternIn({"non_finite"});
        layerIs(L);
        expect(s.heads == std::vector<int>{o.faultHead} && s.kv == "k", "head and part");
        const std::int64_t token = (s.evidencePrompt == "prompt_0" ? o.promptLens[0] : o.promptLens[1]) + o.faultStep;
        expect(own.firstToken == token && own.lastToken == token && own.phase == "decode",
               QString("token %1-%2, not %3").arg(own.firstToken).arg(own.lastToken).arg(token));
        const bool engine = o.fault != FaultKind::NanExpected;
        expect(s.hypothesis.parameter("actual_cells") == (engine ? 1 : 0) &&
                   s.hypothesis.parameter("expected_cells") == (engine ? 0 : 1),
               "side");
        expect(s.hypothesis.parameter(o.fault == FaultKind::Inf ? "inf_cells" : "nan_cells") == 1, "NaN or inf");
        expect(std::isinf(s.score), "score");
        break;
    }
    case FaultKind::ReplicaDiff:  // a capture-level finding (replica_check.h), never a suspect
        expect(false, "replica_diff has no suspect to check");
        break;
    }
    return wrong;
}

void TestSuspects::check(const ModelCaptureOptions& o, const QString& what)
{
    const Run r = run(o);
    const std::vector<Suspect>& all = r.result.suspects;
    const std::string top = all.empty() ? "none"
                                        : std::string(suspectPatternName(all.front().pattern)) + "/" +
                                              (all.front().hypothesis.kind.empty() ? "-" : all.front().hypothesis.kind) +
                                              (all.front().structure ? "+" + all.front().structure->kind : "");
    ++m_confusion[faultName(o.fault)][top];
    // A scale off by less than the off threshold (6 floors) of the format's rounding (another
    // layer's scale, or a head's own, can be that close in the tiny model) is not required: it
    // stays under the floor in every cell. e4m3: 1.75x, e5m2 2.5x, int8 ~1.05x; two-way adds the
    // drift allowance (SuspectThresholds: 20 bf16 unit roundoffs x sqrt(layer + 1)).
    const auto ratio = [&](const char* key) { return r.truth.contains(key) ? std::fabs(std::log(r.truth.at(key).get<double>())) : 1.0; };
    const double resolvable = std::log(1.0 + 12.0 * unitRoundoff(isQuantised(o.kvDtype) ? o.kvDtype : DType::Float8E4M3) +
                                       (o.baseline ? 0.0 : 20.0 * std::sqrt(o.faultLayer + 1.0) * unitRoundoff(DType::BFloat16)));
    const bool underFloor = (o.fault == FaultKind::ScaleOtherLayer || o.fault == FaultKind::ScaleGranularity) &&
                            std::max(ratio("k_ratio"), ratio("v_ratio")) < resolvable;
    if (underFloor && all.empty()) {
        qInfo("%s: scale off by %.2fx, under the format's floor, not required", qPrintable(what),
              std::exp(std::max(ratio("k_ratio"), ratio("v_ratio"))));
        return;
    }
    // Found under the floor, in the few cells rounding happens to lift: the cache's scale off by
    // the other layer's factor is as much as those cells can tell. Scored wrong, not a failure.
    if (underFloor && o.fault == FaultKind::ScaleOtherLayer && all.front().hypothesis.kind == "cache_scale") {
        qInfo("%s: scale off by %.2fx, under the format's floor, named a cache scale", qPrintable(what),
              std::exp(std::max(ratio("k_ratio"), ratio("v_ratio"))));
        ++m_score[halfOf(o.fault)].second;
        return;
    }
    checkLeads(r, what);
    const QStringList wrong = judge(o, r);
    if (o.fault != FaultKind::None && all.empty())
        m_unseen << what;  // `check` would pass it
    if (o.fault != FaultKind::None) {
        auto& [right, count] = m_score[halfOf(o.fault)];
        right += wrong.isEmpty();
        ++count;
    }
    if (!wrong.isEmpty())
        m_failures << what + ": " + wrong.join("; ") +
                          (all.empty() ? QString() : " [" + QString::fromStdString(all.front().evidence) + "]");
}

void TestSuspects::checkLeads(const Run& r, const QString& what)
{
    for (const PromptAnalysis& p : r.result.prompts) {
        if (p.suspects.empty())
            continue;
        const Suspect& s = p.suspects.front();
        const bool unexplained = s.pattern == SuspectPattern::Unexplained ||
                                 (s.pattern == SuspectPattern::WindowEdge && s.hypothesis.kind != "window_mismatch");
        const QString where = what + ", " + QString::fromStdString(p.id) + ": ";
        if (unexplained != s.measured.has_value())
            m_leads << where + (unexplained ? "unexplained without what was measured" : "explained with a measurement");
        m_measured += s.measured.has_value();
        const Hypothesis& h = s.hypothesis;
        if (h.kind.empty() || h.kind == "unrelated")
            continue;
        const OffFloor floor = findOffFloor(p, SuspectThresholds{});
        const double clean = cleanLevel(floor, p, s.worstLayer);
        // At most the clean level plus half the error above it (kLeadShare 0.5).
        if (!(h.residualFloors <= clean + 0.5 * (h.errorFloors - clean)))
            m_leads << where + QString("%1 offers %2 (residual %3 floors, from %4, clean %5)")
                                   .arg(suspectPatternName(s.pattern), QString::fromStdString(h.kind))
                                   .arg(h.residualFloors)
                                   .arg(h.errorFloors)
                                   .arg(clean);
    }
}

void TestSuspects::init()
{
    m_failures.clear();
    m_unseen.clear();
    m_leads.clear();
}

void TestSuspects::runCatalogue(bool threeWay)
{
    const std::vector<std::uint64_t> seeds = threeWay ? std::vector<std::uint64_t>{1, 2} : std::vector<std::uint64_t>{1, 2, 3};
    for (std::uint64_t seed : seeds)
        for (Tp tp : {Tp::Partitioned, Tp::Replicated})
            for (bool slidingSpec : {true, false}) {
                if (!threeWay && !slidingSpec)
                    continue;
                const QString where = QString("%1seed %2, %3, %4 spec")
                                          .arg(threeWay ? "" : "two-way, ")
                                          .arg(seed)
                                          .arg(tp == Tp::Partitioned ? "partitioned" : "replicated")
                                          .arg(slidingSpec ? "sliding" : "full");
                for (FaultKind kind : allFaultKinds()) {
                    // KVSCOPE_SUSPECT_KINDS=tuned (held-out, held-out-2) runs one set, for tuning on it.
                    const QByteArray only = qgetenv("KVSCOPE_SUSPECT_KINDS");
                    if (!only.isEmpty() && only != halfOf(kind))
                        continue;
                    // One head a rank: head-major and token-major are the same bytes.
                    if (kind == FaultKind::LayoutTokenMajor && tp == Tp::Replicated)
                        continue;
                    // Replicas of a head exist only when heads are fewer than ranks.
                    const bool replicaKind = kind == FaultKind::ReplicaWrongHead || kind == FaultKind::ReadRankWrongHead;
                    if (replicaKind && tp == Tp::Partitioned)
                        continue;
                    std::vector<int> layers = everyLayer(kind) ? std::vector<int>{3} : prefillOnly(kind) ? std::vector<int>{3}
                                                                                                             : std::vector<int>{2, 3};
                    for (int layer : layers) {
                        ModelCaptureOptions o = shape(tp, slidingSpec, seed);
                        o.baseline = threeWay;
                        o.fault = kind;
                        o.faultLayer = layer;
                        o.faultHead = 1;
                        o.faultRank = 1;
                        // Rank 3, head 1's replica, holding head 0; rank 2, head 1's copy read, holding head 0.
                        if (replicaKind)
                            o.faultRank = kind == FaultKind::ReplicaWrongHead ? 3 : 2;
                        o.faultStep = 10;  // late enough that a sliding-window layer still holds the position
                        // Prompts whose last block (8 positions in the full layers) is at most half
                        // full (mod 8 = 0, 2, 4) and fuller (5, 7, 7).
                        if (kind == FaultKind::LastBlockFill)
                            o.promptLens = {24, 31, 26, 29, 20, 23};
                        check(o, QString("%1, layer %2, %3").arg(where).arg(layer).arg(QString::fromStdString(faultName(kind))));
                    }
                }
            }
}

void TestSuspects::catalogueThreeWay()
{
    runCatalogue(true);
    if (!m_failures.isEmpty())
        qInfo("%s", qPrintable(QString("%1 wrong of %2:\n").arg(m_failures.size()).arg(m_count) + m_failures.join("\n")));
    QVERIFY2(m_failures.size() * 20 <= m_count, "more than 5% wrong");
    QVERIFY2(m_unseen.isEmpty(), qPrintable("faults without a suspect: " + m_unseen.join("; ")));
    QVERIFY2(m_leads.isEmpty(), qPrintable("leads that do not lead:\n" + m_leads.join("\n")));
}

void TestSuspects::catalogueTwoWay()
{
    const int before = m_count;
    runCatalogue(false);
    if (!m_failures.isEmpty())
        qInfo("%s", qPrintable(QString("%1 wrong of %2:\n").arg(m_failures.size()).arg(m_count - before) + m_failures.join("\n")));
    QVERIFY2(m_failures.size() * 20 <= m_count - before, "more than 5% wrong");
    // Every fault fails `check` without a baseline too.
    QVERIFY2(m_unseen.isEmpty(), qPrintable("faults without a suspect: " + m_unseen.join("; ")));
    QVERIFY2(m_leads.isEmpty(), qPrintable("leads that do not lead:\n" + m_leads.join("\n")));
}

void TestSuspects::cleanCapturesHaveNone()
{
    for (std::uint64_t seed : {1u, 2u, 3u, 4u})
        for (Tp tp : {Tp::Partitioned, Tp::Replicated})
            for (bool slidingSpec : {true, false})
                for (bool threeWay : {true, false}) {
                    if (!threeWay && seed > 2)
                        continue;
                    ModelCaptureOptions o = shape(tp, slidingSpec, seed);
                    o.baseline = threeWay;
                    check(o, QString("clean, seed %1%2").arg(seed).arg(threeWay ? "" : ", two-way"));
                }
    for (bool threeWay : {true, false}) {
        const QString mode = threeWay ? "" : ", two-way";
        ModelCaptureOptions fp8 = shape(Tp::Partitioned, true, 6);
        fp8.kvDtype = DType::Float8E4M3;
        fp8.baseline = threeWay;
        check(fp8, "clean, fp8 cache" + mode);
        ModelCaptureOptions longer = shape(Tp::Partitioned, true, 5);
        longer.promptLens = {600, 1000};
        longer.decodeTokens = 40;
        longer.baseline = threeWay;
        check(longer, "clean, prompts of 600 and 1000 tokens" + mode);
        // kvscope synth's own shape, 16 layers x 2008 positions (64,000 cells a part): the clean
        // ratio's tail at this size crossed a threshold growing 1.5 floors a decade, in three
        // cells of layer 15 (docs/suspects.md).
        ModelCaptureOptions synthDefault;
        synthDefault.shape.layers = 16;
        synthDefault.promptLens = {2000};
        synthDefault.decodeTokens = 8;
        synthDefault.baseline = threeWay;
        check(synthDefault, "clean, kvscope synth's shape, 16 layers x 2000 tokens" + mode);
        ModelCaptureOptions deep = shape(Tp::Partitioned, true, 7);
        deep.shape.layers = 80;
        deep.promptLens = {60, 90};
        deep.baseline = threeWay;
        check(deep, "clean, 80 layers" + mode);
    }
    QVERIFY2(m_failures.isEmpty(), qPrintable(QString("%1 wrong:\n").arg(m_failures.size()) + m_failures.join("\n")));
}

void TestSuspects::llama3ScaledRope()
{
    // A model with Llama 3.1's RoPE scaling (its original context 32 positions, the prompts past
    // it): clean, no suspect; K rotated one position too far, the RoPE offset explains it.
    for (std::uint64_t seed : {1u, 2u})
        for (bool threeWay : {true, false}) {
            ModelCaptureOptions o = shape(Tp::Partitioned, true, seed);
            o.shape.llama3Rope = true;
            o.promptLens = {40, 60};
            o.baseline = threeWay;
            const QString mode = QString("llama3 RoPE, seed %1%2").arg(seed).arg(threeWay ? "" : ", two-way");
            check(o, "clean, " + mode);
            o.fault = FaultKind::RopeOffset;
            o.faultLayer = 2;
            check(o, "rope_offset, " + mode);
        }
    QVERIFY2(m_failures.isEmpty(), qPrintable(QString("%1 wrong:\n").arg(m_failures.size()) + m_failures.join("\n")));
    QVERIFY2(m_unseen.isEmpty(), qPrintable("faults without a suspect: " + m_unseen.join("; ")));
    QVERIFY2(m_leads.isEmpty(), qPrintable("leads that do not lead:\n" + m_leads.join("\n")));
}

void TestSuspects::quantisedCaches()
{
    // Every quantised format and granularity: clean, a clean cache gives no suspect; each scale
    // fault is found and named, at its layer, with and without a baseline.
    struct Cache {
        DType dtype;
        ScaleGranularity scale;
    };
    const Cache caches[] = {{DType::Float8E4M3, ScaleGranularity::Tensor}, {DType::Float8E4M3, ScaleGranularity::Head},
                            {DType::Float8E4M3, ScaleGranularity::TokenHead}, {DType::Float8E5M2, ScaleGranularity::Tensor},
                            {DType::Float8E4M3Fnuz, ScaleGranularity::Head}, {DType::Int8, ScaleGranularity::Head},
                            {DType::Int8, ScaleGranularity::TokenHead}};
    const int before = m_count;
    for (const Cache& cache : caches)
        for (bool threeWay : {true, false})
            for (FaultKind kind : {FaultKind::None, FaultKind::Fp8Scale, FaultKind::ScaleGranularity, FaultKind::ScaleOtherLayer}) {
                if ((kind == FaultKind::ScaleGranularity && cache.scale != ScaleGranularity::Head) ||
                    (kind == FaultKind::ScaleOtherLayer && cache.scale != ScaleGranularity::Tensor))
                    continue;
                for (int layer : {2, 3}) {
                    ModelCaptureOptions o = shape(Tp::Partitioned, true, 11);
                    o.kvDtype = cache.dtype;
                    o.kvScale = cache.scale;
                    o.baseline = threeWay;
                    o.fault = kind;
                    o.faultLayer = layer;
                    const QString what = QString("%1 per %2%3, layer %4, %5")
                                             .arg(QString::fromStdString(dtypeName(cache.dtype)), granularityName(cache.scale),
                                                  threeWay ? "" : ", two-way")
                                             .arg(layer)
                                             .arg(QString::fromStdString(faultName(kind)));
                    if (kind == FaultKind::None) {
                        // A clean quantised cache passes `check` as a whole: no suspect, no L-inf
                        // multiplier or BC against its own floor out of bounds.
                        const Run r = run(o);
                        for (const Violation& v : checkThresholds(r.result, Thresholds{}))
                            m_failures << what + ": check fails: " + QString::fromStdString(v.metric) + " = " +
                                              QString::number(v.value);
                    }
                    check(o, what);
                }
            }
    qInfo("quantised caches: %d captures", m_count - before);
    QVERIFY2(m_failures.isEmpty(), qPrintable(QString("%1 wrong:\n").arg(m_failures.size()) + m_failures.join("\n")));
    QVERIFY2(m_unseen.isEmpty(), qPrintable("faults without a suspect: " + m_unseen.join("; ")));
    QVERIFY2(m_leads.isEmpty(), qPrintable("leads that do not lead:\n" + m_leads.join("\n")));
}

void TestSuspects::aFaultInEveryCellIsFound()
{
    // V of every head of every layer 0.8x: every cell is off, so no typical value can be clean.
    for (bool threeWay : {true, false}) {
        ModelCaptureOptions o = shape(Tp::Partitioned, true, 3);
        o.baseline = threeWay;
        o.fault = FaultKind::GlobalVScale;
        const Run r = run(o);
        QVERIFY2(!r.result.suspects.empty(), threeWay ? "three-way" : "two-way");
        QCOMPARE(r.result.suspects.front().hypothesis.kind, std::string("scale"));
    }
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
    const char* fields[] = {"pattern", "score", "evidence", "hypothesis", "tried", "prompts", "first_layer", "layers", "kv",
                            "heads", "tp_ranks", "dcp_ranks", "tokens", "phase", "blocks", "worst_cell"};
    QCOMPARE(json.at("suspects").size(), std::size_t(1));
    const nlohmann::json& top = json.at("suspects")[0];
    for (const char* field : fields)
        QVERIFY2(top.contains(field), field);  // never missing
    QCOMPARE(top.at("pattern").get<std::string>(), std::string("block"));
    QCOMPARE(top.at("hypothesis").at("kind").get<std::string>(), std::string("unrelated"));
    for (const char* field : {"parameters", "text", "residual_floors", "error_floors", "explained_share"})
        QVERIFY2(top.at("hypothesis").contains(field), field);
    QVERIFY(top.at("tried").size() >= 5);
    QCOMPARE(top.at("first_layer").get<std::string>(), layerName(1));  // the group's first layer
    QCOMPARE(top.at("blocks")[0].at("logical").get<std::int64_t>(), r.truth.at("logical_block").get<std::int64_t>());
    QCOMPARE(top.at("blocks")[0].at("physical").get<std::int64_t>(), r.truth.at("stale_block").get<std::int64_t>());
    QVERIFY(top.at("prompts") == nlohmann::json::array({"prompt_0"}));
    // Per prompt: the faulty prompt has it, the other an empty list.
    QCOMPARE(json.at("prompts")[0].at("suspects").size(), std::size_t(1));
    QVERIFY(json.at("prompts")[1].at("suspects").is_array() && json.at("prompts")[1].at("suspects").empty());
}

void TestSuspects::noiseCountIsPoisson()
{
    // Hand-worked: 1000 cells at offFloor let through one clean cell on average; Poisson(1)
    // reaches 3, 4, 5 cells with chances 0.0803, 0.0190, 0.00366.
    const SuspectThresholds th;
    QCOMPARE(noiseOffCells(1000, th.offFloor, th, 0.1), 3);
    QCOMPARE(noiseOffCells(1000, th.offFloor, th, 0.05), 4);
    QCOMPARE(noiseOffCells(1000, th.offFloor, th, 0.01), 5);
    // Ten times the cells one decade higher: the same; a tenth of them: Poisson(0.1) reaches 1
    // and 2 with chances 0.0952 and 0.00468.
    QCOMPARE(noiseOffCells(10000, th.offFloor + th.perDecade, th, 0.01), 5);
    QCOMPARE(noiseOffCells(100, th.offFloor, th, 0.1), 1);
    QCOMPARE(noiseOffCells(100, th.offFloor, th, 0.01), 2);
    QCOMPARE(noiseOffCells(0, th.offFloor, th, 0.01), 1);  // none expected: any one is more
}

void TestSuspects::nonFiniteIsNamedFirst()
{
    // One value of K of one head at one decode token, in a sliding and a full layer: NaN or
    // +inf in the engine's cache, or NaN in the reference (expected). The top suspect names it
    // (judge: layer, head, token, part, side), three-way and two-way, before anything finite;
    // the worst cells list it first. Not scored with the catalogue (nothing to explain).
    const int before = m_count;
    for (FaultKind kind : {FaultKind::Nan, FaultKind::Inf, FaultKind::NanExpected})
        for (bool threeWay : {true, false})
            for (int layer : {2, 3}) {
                ModelCaptureOptions o = shape(Tp::Partitioned, true, 1);
                o.baseline = threeWay;
                o.fault = kind;
                o.faultLayer = layer;
                o.faultHead = 5;
                o.faultStep = 10;
                const QString what = QString("%1%2, layer %3").arg(QString::fromStdString(faultName(kind)), threeWay ? "" : ", two-way").arg(layer);
                const Run r = run(o);
                QVERIFY2(!r.result.suspects.empty(), qPrintable(what + ": no suspect"));
                const QStringList wrong = judge(o, r);
                QVERIFY2(wrong.isEmpty(), qPrintable(what + ": " + wrong.join("; ") + " [" +
                                                     QString::fromStdString(r.result.suspects.front().evidence) + "]"));
                for (const PromptAnalysis& p : r.result.prompts) {
                    QVERIFY2(!p.suspects.empty() && p.suspects.front().pattern == SuspectPattern::NonFinite, qPrintable(what));
                    // The analysis says which input holds it, and what it is.
                    QCOMPARE(p.nonFinite.size(), std::size_t(1));
                    QCOMPARE(p.nonFinite[0].side, std::string(kind == FaultKind::NanExpected ? "expected" : "actual"));
                    QCOMPARE(p.nonFinite[0].value, std::string(kind == FaultKind::Inf ? "inf" : "nan"));
                    const std::vector<WorstCell> worst = worstCells(p, 3);
                    QVERIFY2(worst[0].nonFinite && worst[0].layer == layer && worst[0].head == 5 && worst[0].part == KvPart::K,
                             qPrintable(what));
                    QVERIFY(std::isinf(worst[0].ratio) && !worst[1].nonFinite);
                }
                // `check` fails it, the suspect first.
                const std::vector<Violation> v = checkThresholds(r.result, Thresholds{});
                QVERIFY(!v.empty());
                QVERIFY2(v.front().metric.find("non_finite") != std::string::npos, v.front().metric.c_str());
            }
    qInfo("non-finite: %d captures", m_count - before);
}

void TestSuspects::checkNamesAPooledSuspectByItsEvidencePrompt()
{
    // Seen in p0 (from token 64) and p1 (from 96), its evidence about p1: the verdict names p1
    // first and gives no token, since the pooled first token (64) is p0's and the sentence p1's.
    const auto suspect = [](const std::string& prompt, std::int64_t first, double score) {
        Suspect s;
        s.pattern = SuspectPattern::Head;
        s.firstLayer = "l3";
        s.prompts = {prompt};
        s.heads = {1};
        s.firstToken = first;
        s.lastToken = first + 20;
        s.score = score;
        s.evidencePrompt = prompt;
        s.evidence = "about " + prompt;
        return s;
    };
    AnalysisResult pooled;
    pooled.suspects = poolSuspects({{suspect("p0", 64, 35.1)}, {suspect("p1", 96, 35.9)}});
    QCOMPARE(pooled.suspects.size(), std::size_t(1));
    std::vector<Violation> v = checkThresholds(pooled, Thresholds{});
    QCOMPARE(v.size(), std::size_t(1));
    QCOMPARE(v[0].prompt, std::string("p1,p0"));
    QCOMPARE(v[0].token, std::int64_t(-1));
    QCOMPARE(v[0].detail, std::string("about p1"));
    QCOMPARE(v[0].head, 1);

    AnalysisResult one;  // one prompt: its own first token
    one.suspects = {suspect("p0", 64, 35.1)};
    v = checkThresholds(one, Thresholds{});
    QCOMPARE(v.size(), std::size_t(1));
    QCOMPARE(v[0].prompt, std::string("p0"));
    QCOMPARE(v[0].token, std::int64_t(64));
}

void TestSuspects::nonFiniteHandMade()
{
    // A prompt of two layers of the hand-made shape (4 KV heads over TP 2: heads 2, 3 on rank 1),
    // every cell quiet but the listed non-finite ones: the suspect names the first layer in model
    // order, its heads, tokens, parts, TP ranks and sides; later layers are named as following.
    const KvCacheConfig cfg = KvCacheConfig::fromJson(R"({"num_blocks": 16, "tp_size": 2, "total_num_kv_heads": 4, "groups": [
        {"layer_names": ["l0", "l1"], "spec_type": "FullAttentionSpec", "block_size": 4, "dtype": "torch.bfloat16",
         "num_kv_heads": 2, "head_size": 8}]})");
    PromptAnalysis p;
    p.id = "p";
    p.promptLen = 20;
    p.tokens = 24;
    p.heads = 4;
    p.threeWay = true;
    p.layers = {"l0", "l1"};
    p.layerGroups = {0, 0};
    p.allocate();
    QVERIFY(!nonFiniteSuspect(p, cfg).has_value());  // none: no suspect
    p.nonFinite = {{0, 21, 2, KvPart::V, "expected", "nan"},
                   {0, 22, 3, KvPart::V, "expected", "-inf"},
                   {1, 5, 0, KvPart::K, "actual", "nan"}};
    std::optional<Suspect> s = nonFiniteSuspect(p, cfg);
    QVERIFY(s.has_value());
    QCOMPARE(s->pattern, SuspectPattern::NonFinite);
    QCOMPARE(QString(suspectPatternName(s->pattern)), QString("non_finite"));
    QCOMPARE(s->hypothesis.kind, std::string("non_finite"));
    QCOMPARE(s->firstLayer, std::string("l0"));
    QCOMPARE(s->layers, (std::vector<std::string>{"l0", "l1"}));
    QCOMPARE(s->heads, (std::vector<int>{2, 3}));
    QCOMPARE(s->tpRanks, std::vector<int>{1});
    QCOMPARE(s->kv, std::string("v"));
    QCOMPARE(s->firstToken, std::int64_t(21));
    QCOMPARE(s->lastToken, std::int64_t(22));
    QCOMPARE(s->phase, std::string("decode"));
    QVERIFY(std::isinf(s->score));
    QCOMPARE(s->hypothesis.parameter("cells"), 2.0);
    QCOMPARE(s->hypothesis.parameter("nan_cells"), 1.0);
    QCOMPARE(s->hypothesis.parameter("inf_cells"), 1.0);
    QCOMPARE(s->hypothesis.parameter("actual_cells"), 0.0);
    QCOMPARE(s->hypothesis.parameter("expected_cells"), 2.0);
    QVERIFY2(s->evidence.find("the reference (expected)") != std::string::npos &&
                 s->evidence.find("NaN and infinity") != std::string::npos && s->evidence.find("finite there") != std::string::npos,
             s->evidence.c_str());
    // Only layer 1 finished: its engine-side NaN, at one head and token, K.
    const std::vector<char> ready = {0, 1};
    s = nonFiniteSuspect(p, cfg, &ready);
    QVERIFY(s.has_value());
    QCOMPARE(s->firstLayer, std::string("l1"));
    QCOMPARE(s->heads, std::vector<int>{0});
    QCOMPARE(s->tpRanks, std::vector<int>{0});
    QCOMPARE(s->kv, std::string("k"));
    QCOMPARE(s->phase, std::string("prefill"));
    QCOMPARE(s->hypothesis.parameter("actual_cells"), 1.0);
    QCOMPARE(s->worstToken, std::int64_t(5));
    QVERIFY2(s->evidence.find("the engine's cache") != std::string::npos, s->evidence.c_str());
    // Pooled with a finite suspect of a higher layer, it still ranks first.
    Suspect finite;
    finite.pattern = SuspectPattern::Layer;
    finite.score = 1e6;
    finite.firstLayer = "l0";
    const std::vector<Suspect> pooled = poolSuspects({{finite}, {*s}});
    QCOMPARE(pooled.size(), std::size_t(2));
    QCOMPARE(pooled.front().pattern, SuspectPattern::NonFinite);
    // The JSON keeps it (its score null: no floor measures it), and reads it back as +inf.
    AnalysisResult result;
    p.suspects = {*s};
    result.prompts = {p};
    result.suspects = pooled;
    std::ostringstream text;
    writeAnalysisJson(result, text);
    const nlohmann::json json = nlohmann::json::parse(text.str());
    QCOMPARE(json.at("suspects")[0].at("pattern").get<std::string>(), std::string("non_finite"));
    QVERIFY(json.at("suspects")[0].at("score").is_null());
    QCOMPARE(json.at("prompts")[0].at("non_finite")[1].at("value").get<std::string>(), std::string("-inf"));
}

void TestSuspects::labelsFollowTheHypothesis()
{
    // The pattern never contradicts the explaining hypothesis: two heads of one rank swapped are
    // `head` (TP 4: the rank's only heads; TP 2: two of its four), every rank's shard exchanged
    // (TP 2: every head off) is `tp_rank` with those ranks, and K negated over a whole sliding
    // layer is `layer` under both window specs.
    for (bool threeWay : {true, false}) {
        const QString mode = threeWay ? "" : ", two-way";
        for (int tp : {4, 2}) {
            ModelCaptureOptions o = shape(Tp::Partitioned, true, 1);
            o.baseline = threeWay;
            o.tpSize = tp;
            o.fault = FaultKind::HeadSwap;
            o.faultLayer = 3;
            o.faultHead = 5;  // with head 4: rank 2 of 4, or two of rank 1's four
            Run r = run(o);
            QVERIFY(!r.result.suspects.empty());
            const Suspect& s = r.result.suspects.front();
            QVERIFY2(s.pattern == SuspectPattern::Head && s.hypothesis.kind == "head_swap" && s.heads == std::vector<int>({4, 5}),
                     qPrintable(QString("head_swap, TP %1%2: %3").arg(tp).arg(mode, QString::fromStdString(s.evidence))));
            o.fault = FaultKind::ShardSwap;
            o.faultRank = 0;
            r = run(o);
            QVERIFY(!r.result.suspects.empty());
            const Suspect& t = r.result.suspects.front();
            QVERIFY2(t.pattern == SuspectPattern::TpRank && t.hypothesis.kind == "rank_swap" && t.tpRanks == std::vector<int>({0, 1}),
                     qPrintable(QString("shard_swap, TP %1%2: %3").arg(tp).arg(mode, QString::fromStdString(t.evidence))));
        }
        for (bool slidingSpec : {true, false}) {
            ModelCaptureOptions o = shape(Tp::Partitioned, slidingSpec, 2);
            o.baseline = threeWay;
            o.fault = FaultKind::KNegated;
            o.faultLayer = 2;  // a sliding layer
            const Run r = run(o);
            QVERIFY(!r.result.suspects.empty());
            for (const PromptAnalysis& p : r.result.prompts) {
                QVERIFY(!p.suspects.empty());
                const Suspect& s = p.suspects.front();
                QVERIFY2(s.pattern == SuspectPattern::Layer && s.hypothesis.kind == "scale",
                         qPrintable(QString("k_negated, %1 spec%2, %3: %4")
                                        .arg(slidingSpec ? "sliding" : "full", mode, QString::fromStdString(p.id),
                                             QString::fromStdString(s.evidence))));
            }
        }
    }
}

void TestSuspects::magnitudeFaults()
{
    // Magnitude with the direction intact, each explained by its own free fit (hypotheses.h),
    // at its layer: three-way and two-way, both TP modes, in a sliding and a full layer.
    for (FaultKind kind : magnitudeFaultKinds())
        for (bool threeWay : {true, false})
            for (Tp tp : {Tp::Partitioned, Tp::Replicated})
                for (int layer : {2, 3}) {
                    ModelCaptureOptions o = shape(tp, true, 1);
                    o.baseline = threeWay;
                    o.fault = kind;
                    o.faultLayer = layer;
                    o.faultHead = 1;
                    check(o, QString("%1%2, %3, layer %4")
                                 .arg(QString::fromStdString(faultName(kind)), threeWay ? "" : ", two-way",
                                      tp == Tp::Partitioned ? "partitioned" : "replicated")
                                 .arg(layer));
                }
    QVERIFY2(m_failures.isEmpty(), qPrintable(QString("%1 wrong:\n").arg(m_failures.size()) + m_failures.join("\n")));
    QVERIFY2(m_unseen.isEmpty(), qPrintable("faults without a suspect: " + m_unseen.join("; ")));
    QVERIFY2(m_leads.isEmpty(), qPrintable("leads that do not lead:\n" + m_leads.join("\n")));
}

void TestSuspects::cachePageOrders()
{
    // Hand-worked, 5 blocks: K/V-first memory is K0..K4 V0..V4; read blocks-first, block b's K
    // is page 2b and its V page 2b + 1 of that memory.
    const std::vector<CacheMisread> m = cacheMisreads(5);
    QCOMPARE(m.size(), std::size_t(2));
    QCOMPARE(m[0].writtenAs + "/" + m[0].readAs, std::string("kv_first/blocks_first"));
    const auto is = [](CachePage got, KvPart part, std::int64_t block) { return got.part == part && got.block == block; };
    QVERIFY(is(m[0].source({KvPart::K, 0}), KvPart::K, 0));
    QVERIFY(is(m[0].source({KvPart::V, 0}), KvPart::K, 1));
    QVERIFY(is(m[0].source({KvPart::K, 2}), KvPart::K, 4));
    QVERIFY(is(m[0].source({KvPart::V, 2}), KvPart::V, 0));
    QVERIFY(is(m[0].source({KvPart::K, 4}), KvPart::V, 3));
    QVERIFY(is(m[0].source({KvPart::V, 4}), KvPart::V, 4));
    // Blocks-first memory is K0 V0 K1 V1 ... V4; read K/V-first, K of block b is page b and V
    // of block b page 5 + b.
    QCOMPARE(m[1].writtenAs + "/" + m[1].readAs, std::string("blocks_first/kv_first"));
    QVERIFY(is(m[1].source({KvPart::K, 3}), KvPart::V, 1));
    QVERIFY(is(m[1].source({KvPart::V, 0}), KvPart::V, 2));
    QVERIFY(is(m[1].source({KvPart::V, 4}), KvPart::V, 4));
    // Each undoes the other, page by page.
    for (KvPart part : {KvPart::K, KvPart::V})
        for (std::int64_t b = 0; b < 5; ++b) {
            QVERIFY(m[1].source(m[0].source({part, b})) == (CachePage{part, b}));
            QVERIFY(m[0].source(m[1].source({part, b})) == (CachePage{part, b}));
        }
}

void TestSuspects::replicasHoldingAnotherHead()
{
    // 2 KV heads over TP 4 (ranks 0, 1 hold head 0; 2, 3 head 1; 0 and 2 are read). Rank 3
    // holding head 0: its replica difference names it, from the ground truth, and says so in
    // the analysis JSON, read back the same; a bit flipped in a replica, or ranks 1 and 2
    // exchanged (no head keeps two agreeing copies to trust), names no head.
    ModelCaptureOptions o = shape(Tp::Replicated, true, 1);
    o.fault = FaultKind::ReplicaWrongHead;
    o.faultLayer = 3;
    o.faultRank = 3;
    const Run r = run(o);
    const std::string layer = layerName(3);
    for (const PromptAnalysis& p : r.result.prompts) {
        QVERIFY(!p.replicaDifferences.empty());
        for (const ReplicaDifference& d : p.replicaDifferences) {
            QCOMPARE(d.layer, layer);
            QCOMPARE(d.rank, 3);
            QCOMPARE(d.againstRank, 2);
            QCOMPARE(d.head, r.truth.at("should_hold_head").get<int>());
            QCOMPARE(d.copyHoldsHead, r.truth.at("holds_head").get<int>());
            QCOMPARE(d.readHoldsHead, -1);
            QCOMPARE(d.holdsFrom, r.truth.at("holds_rank").get<int>());
            QVERIFY2(d.describe().find("TP rank 3 holds KV head 0, should hold head 1 (its replica on rank 2 does)") != std::string::npos,
                     d.describe().c_str());
        }
    }
    // Its suspect, from the replica differences alone: the rank, the head it should hold.
    const std::vector<Suspect> own = replicaHeadSuspects(r.result.prompts.front());
    QCOMPARE(own.size(), std::size_t(1));
    QVERIFY(own[0].pattern == SuspectPattern::TpRank && own[0].tpRanks == std::vector<int>{3} &&
            own[0].heads == std::vector<int>{1} && own[0].firstLayer == layer);
    QCOMPARE(own[0].hypothesis.parameter("holds_head"), 0.0);
    QCOMPARE(own[0].hypothesis.parameter("read"), 0.0);
    std::ostringstream text;
    writeAnalysisJson(r.result, text);
    const JsonFields f("made");
    const JsonFields::Json json = JsonFields::Json::parse(text.str());
    PromptAnalysis back;
    readPromptFindings(f, json.at("prompts").at(0), "prompts[0].", back);
    const std::vector<ReplicaDifference>& want = r.result.prompts.front().replicaDifferences;
    QCOMPARE(back.replicaDifferences.size(), want.size());
    for (std::size_t i = 0; i < want.size(); ++i) {
        const ReplicaDifference& a = back.replicaDifferences[i];
        const ReplicaDifference& b = want[i];
        QVERIFY(a.head == b.head && a.copyHoldsHead == b.copyHoldsHead && a.readHoldsHead == b.readHoldsHead &&
                a.holdsFrom == b.holdsFrom && a.describe() == b.describe());
    }
    for (FaultKind kind : {FaultKind::ReplicaDiff, FaultKind::ShardSwap}) {
        ModelCaptureOptions q = shape(Tp::Replicated, true, 1);
        q.fault = kind;
        q.faultLayer = 3;
        q.faultRank = 1;
        const Run x = run(q);
        bool differs = false;
        for (const PromptAnalysis& p : x.result.prompts)
            for (const ReplicaDifference& d : p.replicaDifferences) {
                differs = true;
                QVERIFY2(d.copyHoldsHead < 0 && d.readHoldsHead < 0 && d.wrongHeadText().empty(), d.describe().c_str());
            }
        QVERIFY2(differs, faultName(kind).c_str());
        for (const Suspect& s : x.result.suspects)
            QVERIFY2(s.hypothesis.kind != "replica_head", s.evidence.c_str());
    }
}

void TestSuspects::cleanupTestCase()
{
    // The confusion table and the two scores, for the record (docs/suspects.md).
    QString table = "\ninjected fault        top suspect pattern/hypothesis (count)\n";
    for (const auto& [fault, row] : m_confusion) {
        table += QString::fromStdString(fault).leftJustified(22);
        for (const auto& [pattern, count] : row)
            table += QString("%1 %2   ").arg(QString::fromStdString(pattern)).arg(count);
        table += "\n";
    }
    for (const auto& [half, score] : m_score)
        table += QString("%1: %2 of %3 right\n").arg(QString::fromStdString(half)).arg(score.first).arg(score.second);
    table += QString("unexplained suspects saying what was measured: %1\n").arg(m_measured);
    qInfo("%s", qPrintable(table));
}

QTEST_APPLESS_MAIN(TestSuspects)
#include "tst_suspects.moc"
