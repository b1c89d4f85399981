// A long context is read and compared a window of tokens at a time (AnalysisOptions::
// windowTokens): the loader's windows hold exactly the window's positions, with the values the
// whole layer has there, and an analysis in windows writes the same JSON, byte for byte, as one
// that reads each layer whole, on every kind of capture (three-way with pooled BCs, two-way,
// quantised, replicated and DCP ranks, sliding windows, prefix caching, MLA, multi-snapshot).

#include "analysis/analysis_json.h"
#include "analysis/analyzer.h"
#include "analysis/heatmap_grid.h"
#include "format/bundle_reader.h"
#include "kv/capture_loader.h"
#include "kv/sampled_layer.h"
#include "small_model.h"
#include "synth/synthetic_capture.h"

#include <QTemporaryDir>
#include <QTest>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <sstream>

using namespace kvscope;
using namespace kvscope::synth;

class TestTokenWindows : public QObject {
    Q_OBJECT

private slots:
    void loaderWindowsHoldTheirPositions();
    void referenceIsChunkedAlongPositions();
    void windowedAnalysisWritesTheSameJson_data();
    void windowedAnalysisWritesTheSameJson();
    void windowsFollowTheBudget();
    void windowDoneShowsTheRowsStart();

private:
    std::string path(const std::string& name) const { return (m_dir.path() + "/").toStdString() + name; }
    QTemporaryDir m_dir;
};

namespace {

std::string analysisJson(const std::string& bundle, std::int64_t windowTokens, int threads, std::size_t windowBytes = 0,
                         bool spilled = false)
{
    AnalysisOptions options;
    options.windowTokens = windowTokens;
    options.windowBytes = windowBytes;
    options.threads = threads;
    options.resultsInMemoryBytes = spilled ? 1 : 0;
    const AnalysisResult result = analyzeBundle(std::make_shared<BundleReader>(bundle), options);
    if (spilled && !result.prompts.empty() && !result.prompts.front().metrics[0].spilled())
        return "the results were not spilled";
    std::ostringstream out;
    writeAnalysisJson(result, out);
    return out.str();
}

// Every value of present positions, bit for bit; NaN where absent.
bool sameValuesAt(const LayerKv& a, const LayerKv& b, std::int64_t pos)
{
    for (KvPart part : {KvPart::K, KvPart::V})
        for (int h = 0; h < a.heads; ++h)
            if (std::memcmp(&a.values(part)[a.index(part, h, pos)], &b.values(part)[b.index(part, h, pos)],
                            sizeof(float) * std::size_t(a.dims.of(part))) != 0)
                return false;
    return true;
}

}  // namespace

void TestTokenWindows::loaderWindowsHoldTheirPositions()
{
    ModelCaptureOptions o = kvtest::smallModel(FaultKind::RopeOffset);
    writeModelCapture(path("loader.h5"), o);
    const CaptureLoader loader(std::make_shared<BundleReader>(path("loader.h5")));
    for (const PromptInfo& prompt : loader.prompts())
        for (const std::string& layer : {std::string("model.layers.0.self_attn"), std::string("model.layers.1.self_attn")}) {
            const std::int64_t seq = loader.sequenceLength(prompt.id);
            const LayerKv engine = loader.engineLayer(prompt.id, layer);
            const LayerKv expected = loader.referenceLayer(prompt.id, ReferenceRole::Expected, layer);
            // Windows that start and end inside blocks (blocks are 4 and 8 positions).
            for (const PositionRange window : {PositionRange{0, 7}, PositionRange{7, 21}, PositionRange{21, seq}}) {
                const LayerKv e = loader.engineSource(prompt.id, layer, nullptr, window).materialize();
                const LayerKv r = loader.referenceSource(prompt.id, ReferenceRole::Expected, layer, window).materialize();
                QCOMPARE(e.seq, seq);
                QCOMPARE(r.seq, seq);
                for (std::int64_t pos = 0; pos < seq; ++pos) {
                    const bool inside = window.contains(pos);
                    QCOMPARE(bool(e.present[std::size_t(pos)]), inside && engine.present[std::size_t(pos)]);
                    QCOMPARE(bool(r.present[std::size_t(pos)]), inside && expected.present[std::size_t(pos)]);
                    if (e.present[std::size_t(pos)])
                        QVERIFY(sameValuesAt(e, engine, pos));
                    if (r.present[std::size_t(pos)])
                        QVERIFY(sameValuesAt(r, expected, pos));
                }
            }
            // A layer sampled at some positions, a window of 7 at a time (what explaining a
            // suspect reads): their values bit for bit, nothing elsewhere.
            const std::vector<std::int64_t> chosen{seq - 1, 3, 3, 8, 20, 21, 22, -4, seq + 9};
            const SampledLayer sampled = SampledLayer::read(chosen, seq, 7, [&](PositionRange window) {
                return loader.engineSource(prompt.id, layer, nullptr, window);
            });
            QCOMPARE(sampled.sampledPositions(), std::size_t(6));
            QCOMPARE(sampled.seq, seq);
            QCOMPARE(sampled.heads, engine.heads);
            for (std::int64_t pos = -1; pos <= seq; ++pos)
                for (int h = 0; h < engine.heads; ++h)
                    for (KvPart part : {KvPart::K, KvPart::V}) {
                        const float* v = sampled.at(part, pos, h);
                        const bool wanted = std::find(chosen.begin(), chosen.end(), pos) != chosen.end() && pos >= 0 && pos < seq;
                        QCOMPARE(v != nullptr, wanted && engine.present[std::size_t(pos)]);
                        if (v)
                            QVERIFY(std::memcmp(v, part == KvPart::K ? engine.kAt(h, pos) : engine.vAt(h, pos),
                                                sizeof(float) * std::size_t(engine.dims.of(part))) == 0);
                    }
            // The fingerprint of a reference read in windows is that of the whole.
            const LayerSource whole = loader.referenceSource(prompt.id, ReferenceRole::Baseline, layer);
            ContentHash hash = whole.startHash();
            for (const PositionRange window : {PositionRange{0, 5}, PositionRange{5, 6}, PositionRange{6, seq}})
                loader.referenceSource(prompt.id, ReferenceRole::Baseline, layer, window).addToHash(hash, window);
            QCOMPARE(hash.value(), whole.contentHash());
        }
}

void TestTokenWindows::referenceIsChunkedAlongPositions()
{
    // 2 heads x 64 wide x 4 bytes = 512 bytes a position: 2,048 positions to a 1 MiB chunk.
    ModelCaptureOptions o = kvtest::smallModel();
    o.shape.kvHeads = 2;
    o.shape.headDim = 64;
    o.shape.queryHeads = 4;
    o.tpSize = 2;
    o.promptLens = {40};
    o.decodeTokens = 8;
    writeModelCapture(path("chunks.h5"), o);
    const BundleReader reader(path("chunks.h5"));
    const std::string layer = "model.layers.1.self_attn";  // full attention: every position
    const BundleReader::Reference whole = reader.readReference("prompt_0", ReferenceRole::Baseline, layer);
    const BundleReader::Reference rows = reader.readReferenceRows("prompt_0", ReferenceRole::Baseline, layer, 10, 30);
    QVERIFY(rows.slab);
    QCOMPARE(rows.slab->firstRow, std::int64_t(10));
    QCOMPARE(rows.slab->seq, whole.k.shape[2]);
    QCOMPARE(rows.k.shape, (std::vector<std::int64_t>{1, 2, 20, 64}));
    // Head h, position s of the slab is [0, h, 10 + s] of the whole.
    const std::size_t size = dtypeSize(whole.k.dtype);
    for (int h = 0; h < 2; ++h)
        for (int s = 0; s < 20; ++s)
            QVERIFY(std::memcmp(rows.k.bytes.data() + (std::size_t(h) * 20 + std::size_t(s)) * 64 * size,
                                whole.k.bytes.data() + (std::size_t(h) * std::size_t(whole.k.shape[2]) + 10 + std::size_t(s)) * 64 * size,
                                64 * size) == 0);
    // Up to 4,096 positions a batch row is one chunk; past that, chunks of about 1 MiB along the
    // positions: 8 heads x 128 wide is 256 positions of fp32 (the baseline), 512 of bf16 (expected).
    SyntheticCaptureOptions wide;
    wide.layers = 1;
    wide.alternateSliding = false;
    wide.kvHeads = 8;
    wide.headDim = 128;
    wide.divergence = -1;
    wide.faultLayer = -1;
    for (const auto& [prompt, chunks] : {std::pair{4076, std::pair{4096, 4096}}, std::pair{4077, std::pair{256, 512}}}) {
        wide.promptLens = {prompt};
        wide.decodeTokens = 20;
        const std::string file = path("wide" + std::to_string(prompt) + ".h5");
        writeSyntheticCapture(file, wide);
        const CaptureLoader loader(std::make_shared<BundleReader>(file));
        QCOMPARE(loader.referencePositionsPerChunk("prompt_0", ReferenceRole::Baseline, "model.layers.0.self_attn"),
                 std::int64_t(chunks.first));
        QCOMPARE(loader.referencePositionsPerChunk("prompt_0", ReferenceRole::Expected, "model.layers.0.self_attn"),
                 std::int64_t(chunks.second));
    }
    // Rows past the end are clipped; none is an empty slab.
    QCOMPARE(reader.readReferenceRows("prompt_0", ReferenceRole::Baseline, layer, 40, 1000).k.shape[2], whole.k.shape[2] - 40);
    QCOMPARE(reader.readReferenceRows("prompt_0", ReferenceRole::Baseline, layer, 5, 5).k.bytes.size(), std::size_t(0));
}

void TestTokenWindows::windowedAnalysisWritesTheSameJson_data()
{
    QTest::addColumn<int>("kind");
    QTest::newRow("three-way, two prompts pooled, rope_offset") << 0;
    QTest::newRow("two-way, dead_head") << 1;
    QTest::newRow("fp8 per token and head, fp8_scale") << 2;
    QTest::newRow("TP 4 replicated heads, rank_unwritten") << 3;
    QTest::newRow("DCP 2") << 4;
    QTest::newRow("prefix caching, prefix_reuse") << 5;
    QTest::newRow("MLA") << 6;
    QTest::newRow("rope_scaling: divergences, several snapshots") << 7;
    QTest::newRow("full-attention spec with a sliding window, three prompts") << 8;
    QTest::newRow("TP 4 replicated heads, replica_diff") << 9;
}

void TestTokenWindows::windowedAnalysisWritesTheSameJson()
{
    QFETCH(int, kind);
    ModelCaptureOptions o = kvtest::smallModel();
    switch (kind) {
    case 0: o.fault = FaultKind::RopeOffset; break;
    case 1: o.baseline = false; o.fault = FaultKind::DeadHead; break;
    case 2: o.kvDtype = DType::Float8E4M3; o.kvScale = ScaleGranularity::TokenHead; o.fault = FaultKind::Fp8Scale; break;
    case 3: o.shape.kvHeads = 2; o.tpSize = 4; o.fault = FaultKind::RankUnwritten; break;
    case 4: o.shape.kvHeads = 2; o.tpSize = 4; o.dcpSize = 2; o.cpInterleave = 2; break;
    case 5: o.fault = FaultKind::PrefixReuse; o.promptLens = {24, 24, 32}; break;
    case 6: o = withMla(o); break;
    case 7: o.fault = FaultKind::RopeScaling; break;
    case 8: o.slidingWindowSpec = false; o.promptLens = {20, 28, 36}; break;
    case 9: o.shape.kvHeads = 2; o.tpSize = 4; o.fault = FaultKind::ReplicaDiff; break;
    }
    const std::string bundle = path("case" + std::to_string(kind) + ".h5");
    writeModelCapture(bundle, o);
    const std::string whole = analysisJson(bundle, 0, 2);
    QVERIFY(whole.find("\"k_linf\"") != std::string::npos);
    if (kind == 9)  // found in one window, counted once
        QVERIFY(whole.find("\"replica_differences\":[{") != std::string::npos);
    // Windows that cut blocks (7), follow them (16), or take most of the sequence (33); with
    // threads or without (the reads then run one after another).
    // Then a prompt at a time (a budget no two prompts fit: a sweep's batches of prompts), whole
    // or in windows. Then with the results in temporary files, released a layer at a time.
    struct Run {
        int window, threads;
        std::size_t bytes;
        bool spilled;
    };
    for (const auto& [window, threads, bytes, spilled] : {Run{7, 2, 0, false}, Run{16, 1, 0, false}, Run{33, 2, 0, false},
                                                          Run{0, 2, 1, false}, Run{7, 1, 1, false}, Run{0, 2, 0, true},
                                                          Run{7, 2, 1, true}}) {
        const std::string windowed = analysisJson(bundle, window, threads, bytes, spilled);
        if (windowed != whole) {
            std::size_t at = 0;
            while (at < whole.size() && at < windowed.size() && whole[at] == windowed[at])
                ++at;
            QFAIL(qPrintable(QString("windows of %1 tokens (budget %5) differ at byte %2: ...%3... against ...%4...")
                                 .arg(window)
                                 .arg(at)
                                 .arg(QString::fromStdString(windowed.substr(at > 80 ? at - 80 : 0, 160)))
                                 .arg(QString::fromStdString(whole.substr(at > 80 ? at - 80 : 0, 160)))
                                 .arg(bytes)
                                 .arg(spilled)));
        }
    }
}

void TestTokenWindows::windowsFollowTheBudget()
{
    // Asked for: windows of that many tokens, the last shorter.
    QCOMPARE(analysisWindows(48, 1000, 7).size(), std::size_t(7));
    QCOMPARE(analysisWindows(48, 1000, 7).back(), (PositionRange{42, 48}));
    QCOMPARE(analysisWindows(48, 1000, 16), (std::vector<PositionRange>{{0, 16}, {16, 32}, {32, 48}}));
    // A layer no longer than a window is read whole.
    QCOMPARE(analysisWindows(48, 1000, 48), (std::vector<PositionRange>{PositionRange::all()}));
    // Automatic: kWindowBytes of every prompt's sides as float32, in multiples of 4,096 tokens.
    // Llama-3-8B's layer, two-way: 8 heads x (128 + 128) x 4 bytes x 2 sides = 16 KiB a token,
    // so 256 MiB hold 16,384 tokens: 131,072 tokens are 8 windows.
    const std::size_t llama = 8 * 256 * 4 * 2;
    QCOMPARE(kWindowBytes / llama, std::size_t(16384));
    const std::vector<PositionRange> windows = analysisWindows(131072, llama, 0);
    QCOMPARE(windows.size(), std::size_t(8));
    QCOMPARE(windows[1], (PositionRange{16384, 32768}));
    // Three-way, 80 prompts of it: never under 4,096 tokens; 2,048 tokens stay whole.
    QCOMPARE(analysisWindows(131072, llama / 2 * 3 * 80, 0)[0], (PositionRange{0, 4096}));
    QCOMPARE(analysisWindows(2048, llama, 0), (std::vector<PositionRange>{PositionRange::all()}));
}

void TestTokenWindows::windowDoneShowsTheRowsStart()
{
    // A viewer shows a long layer as it fills: at each window, the start of the row is what the
    // finished analysis has there, and the rest of the row is not written yet.
    ModelCaptureOptions o = kvtest::smallModel();
    o.fault = FaultKind::RopeOffset;
    o.promptLens = {24, 40};
    const std::string bundle = path("window_done.h5");
    writeModelCapture(bundle, o);
    const HeatmapSpec spec{HeatmapMetric::RelLinf, KvPart::K, HeadReductionKind::Max, 0};
    for (const std::size_t windowBytes : {std::size_t(0), std::size_t(1)}) {  // the prompts together, then one at a time
        struct Seen {
            int layer;
            std::size_t prompt;
            std::int64_t tokens;
            HeatmapGrid row;
        };
        std::vector<Seen> seen;
        int unwrittenBeyond = 0;
        AnalysisOptions options;
        options.windowTokens = 7;
        options.windowBytes = windowBytes;
        options.threads = 2;
        AnalysisResult* running = nullptr;
        options.windowDone = [&](int layer, std::size_t first, std::size_t end, std::int64_t tokens) {
            QVERIFY(first < end && end <= running->prompts.size());
            for (std::size_t pi = first; pi < end; ++pi) {
                const PromptAnalysis& p = running->prompts[pi];
                seen.push_back({layer, pi, tokens, heatmapRowStart(p, spec, layer, tokens)});
                for (std::int64_t t = tokens; t < p.tokens; ++t) {  // not compared yet
                    QVERIFY2(std::isnan(heatmapValue(p, spec, layer, t)), qPrintable(QString("layer %1 token %2").arg(layer).arg(t)));
                    ++unwrittenBeyond;
                }
            }
        };
        auto reader = std::make_shared<BundleReader>(bundle);
        const CaptureLoader loader(reader, options.unreadableBlocks);
        AnalysisResult result = prepareAnalysis(loader, options);
        running = &result;
        runAnalysis(loader, options, result);
        QVERIFY(!seen.empty());
        QVERIFY(unwrittenBeyond > 0);
        int definedShown = 0;  // (a sliding window's layer has none at the start of a long prompt)
        for (const Seen& s : seen) {
            const PromptAnalysis& p = result.prompts[s.prompt];
            QCOMPARE(s.row.columns, std::min(s.tokens, p.tokens));
            QVERIFY(s.tokens % 7 == 0 || s.tokens >= p.tokens);  // a window's end, or the prompt's (its batch done)
            int defined = 0;
            for (std::int64_t t = 0; t < s.row.columns; ++t) {
                const float shown = s.row.values[std::size_t(t)], final = heatmapValue(p, spec, s.layer, t);
                QVERIFY2(std::memcmp(&shown, &final, sizeof(float)) == 0,
                         qPrintable(QString("layer %1 token %2: %3 shown, %4 at the end").arg(s.layer).arg(t).arg(shown).arg(final)));
                defined += !std::isnan(final);
            }
            definedShown += defined;
        }
        QVERIFY(definedShown > 0);
        // Each layer of the longer prompt (40 tokens and 16 decoded): windows ending at 7, 14,
        // ..., 49 before its last, which ends the layer (layerDone).
        QCOMPARE(result.prompts[1].tokens, std::int64_t(56));
        const auto calls = std::count_if(seen.begin(), seen.end(), [](const Seen& s) { return s.prompt == 1; });
        QCOMPARE(int(calls), int(result.prompts[1].layers.size()) * 7);
    }
}

QTEST_GUILESS_MAIN(TestTokenWindows)
#include "tst_token_windows.moc"
