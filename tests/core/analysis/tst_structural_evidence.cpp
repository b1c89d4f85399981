// The chunk-boundary detector on cases worked by hand: a step exactly at a later chunk's first
// position, off from there on and quiet before, is named with its chunk and its chance; an onset
// one position off a chunk start, at chunk 0, a step that does not stay, one chunk only, or
// chunks so short that any onset lands on a start, say nothing. (last_block_fill, which needs a
// capture's analysed prompts, is scored on the synthetic catalogue: tst_suspects.) The synth
// kinds that inject them record which prompts and positions they damage, and refuse prompts
// that cannot show the structure.

#include "analysis/structural_evidence.h"
#include "format/bundle_reader.h"
#include "synth/model_capture.h"

#include <nlohmann/json.hpp>

#include <QTemporaryDir>
#include <QTest>

#include <numeric>

using namespace kvscope;

namespace {

std::set<std::int64_t> span(std::int64_t first, std::int64_t end)
{
    std::set<std::int64_t> s;
    for (std::int64_t t = first; t < end; ++t)
        s.insert(t);
    return s;
}

std::vector<std::int64_t> positions(std::int64_t end)
{
    std::vector<std::int64_t> v(static_cast<std::size_t>(end));
    std::iota(v.begin(), v.end(), 0);
    return v;
}

// A prompt of 24 positions in chunks 0-11 and 12-23, then 16 decode positions.
std::vector<ProvenanceRange> twoChunks()
{
    return parseProvenance(R"([{"start": 0, "end": 12, "kind": "prefill", "chunk": 0},
                               {"start": 12, "end": 24, "kind": "prefill", "chunk": 1},
                               {"start": 24, "end": 40, "kind": "decode", "step": 0}])",
                           40);
}

}  // namespace

class TestStructuralEvidence : public QObject {
    Q_OBJECT

private slots:
    void stepAtAChunkStartIsNamed()
    {
        const std::optional<StructuralFinding> f = chunkBoundaryOf(twoChunks(), span(12, 24), positions(40), 24);
        QVERIFY(f);
        QCOMPARE(f->kind, std::string("chunk_boundary"));
        QCOMPARE(f->parameter("chunk"), 1.0);
        QCOMPARE(f->parameter("boundary"), 12.0);
        QCOMPARE(f->parameter("off_from"), 12.0);       // 12-23, every one
        QCOMPARE(f->parameter("analysed_from"), 12.0);
        QCOMPARE(f->parameter("clean_before"), 12.0);   // 0-11
        QCOMPARE(f->parameter("chance"), 1.0 / 24.0);   // one chunk start among 24 prefill positions
        QVERIFY2(f->text.find("position 12, the first of prefill chunk 1") != std::string::npos, f->text.c_str());
        QVERIFY2(f->text.find("1 in 24") != std::string::npos, f->text.c_str());
        QVERIFY2(f->text.find("decode") == std::string::npos, f->text.c_str());
    }

    void stepThatGoesOnIntoTheDecodeSaysSo()
    {
        const std::optional<StructuralFinding> f = chunkBoundaryOf(twoChunks(), span(12, 31), positions(40), 24);
        QVERIFY(f);
        QCOMPARE(f->parameter("off_from"), 12.0);  // the prefill positions of chunk 1
        QVERIFY2(f->text.find("(and in the decode)") != std::string::npos, f->text.c_str());
    }

    void elevenOfTwelveIsAStepTenOfTwelveIsNot()
    {
        std::set<std::int64_t> off = span(12, 24);
        off.erase(20);  // 11 of 12: at least nine tenths
        QVERIFY(chunkBoundaryOf(twoChunks(), off, positions(40), 24));
        off.erase(21);  // 10 of 12: under nine tenths
        QVERIFY(!chunkBoundaryOf(twoChunks(), off, positions(40), 24));
    }

    void otherOnsetsSayNothing()
    {
        QVERIFY(!chunkBoundaryOf(twoChunks(), span(13, 24), positions(40), 24));  // one past the start
        QVERIFY(!chunkBoundaryOf(twoChunks(), span(0, 24), positions(40), 24));   // chunk 0: no step
        QVERIFY(!chunkBoundaryOf(twoChunks(), {}, positions(40), 24));
        // Chunk 1's start, but before it only one analysed position (a sliding layer's last ones).
        std::vector<std::int64_t> late = positions(40);
        late.erase(late.begin(), late.begin() + 11);
        QVERIFY(!chunkBoundaryOf(twoChunks(), span(12, 24), late, 24));
        // One chunk recorded: no boundary to step at.
        const std::vector<ProvenanceRange> one = parseProvenance(
            R"([{"start": 0, "end": 24, "kind": "prefill", "chunk": 0}, {"start": 24, "end": 40, "kind": "decode", "step": 0}])", 40);
        QVERIFY(!chunkBoundaryOf(one, span(12, 24), positions(40), 24));
    }

    void chunksSoShortThatAnyOnsetLandsOnAStartSayNothing()
    {
        // Chunks of 2 over 10 prefill positions: 4 starts after chunk 0, chance 4 in 10.
        const std::vector<ProvenanceRange> shortChunks = parseProvenance(
            R"([{"start": 0, "end": 2, "kind": "prefill", "chunk": 0}, {"start": 2, "end": 4, "kind": "prefill", "chunk": 1},
                {"start": 4, "end": 6, "kind": "prefill", "chunk": 2}, {"start": 6, "end": 8, "kind": "prefill", "chunk": 3},
                {"start": 8, "end": 10, "kind": "prefill", "chunk": 4}])",
            10);
        QVERIFY(!chunkBoundaryOf(shortChunks, span(4, 10), positions(10), 10));
    }

    void synthRecordsWhatItDamages()
    {
        QTemporaryDir dir;
        const std::string path = dir.filePath("c.h5").toStdString();
        synth::ModelCaptureOptions o;
        o.faultLayer = 3;  // a full layer: blocks of 8
        o.fault = synth::FaultKind::LastBlockFill;
        o.promptLens = {24, 31, 26, 29, 20, 23};  // mod 8: 0, 7, 2, 5, 4, 7
        synth::writeModelCapture(path, o);
        nlohmann::json truth = nlohmann::json::parse(BundleReader(path).metadata().extra.at("synthetic_fault"));
        QVERIFY(truth.at("damaged_prompts") == nlohmann::json({"prompt_0", "prompt_2", "prompt_4"}));
        QVERIFY(truth.at("spared_prompts") == nlohmann::json({"prompt_1", "prompt_3", "prompt_5"}));
        QCOMPARE(truth.at("block_size").get<int>(), 8);

        o.fault = synth::FaultKind::ChunkBoundary;
        o.promptLens = {24, 32};  // default chunks: the first 12 positions (half the shortest), then the rest
        synth::writeModelCapture(path, o);
        BundleReader reader(path);
        truth = nlohmann::json::parse(reader.metadata().extra.at("synthetic_fault"));
        QVERIFY2(truth.at("chunk_start") == nlohmann::json({{"prompt_0", 12}, {"prompt_1", 12}}), truth.dump().c_str());
    }

    void synthRefusesPromptsThatCannotShowIt()
    {
        QTemporaryDir dir;
        const std::string path = dir.filePath("c.h5").toStdString();
        synth::ModelCaptureOptions o;
        o.faultLayer = 3;
        o.fault = synth::FaultKind::LastBlockFill;
        o.promptLens = {12, 20};  // mod 8 = 4, 4: every last block half full, none fuller
        QVERIFY_THROWS_EXCEPTION(std::invalid_argument, synth::writeModelCapture(path, o));
        o.fault = synth::FaultKind::ChunkBoundary;
        o.provenance = "prefill";  // one chunk: no chunk 1
        QVERIFY_THROWS_EXCEPTION(std::invalid_argument, synth::writeModelCapture(path, o));
        o.provenance = "prefill:16,prefill";  // chunk 1 starts after the first prompt's end
        QVERIFY_THROWS_EXCEPTION(std::invalid_argument, synth::writeModelCapture(path, o));
    }
};

QTEST_GUILESS_MAIN(TestStructuralEvidence)
#include "tst_structural_evidence.moc"
