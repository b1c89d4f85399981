// The prompt's `provenance` attribute: parsed as written, every malformed range refused with what
// is wrong, a position's source found, and the ranges said in a line each (decode steps merged);
// written and read back through the bundle writer and reader (a wrong one refused, naming the prompt).

#include "format/bundle_reader.h"
#include "format/provenance.h"
#include "synth/synthetic_capture.h"

#include <QTemporaryDir>
#include <QTest>

using namespace kvscope;

class TestProvenance : public QObject {
    Q_OBJECT

private slots:
    void parsesEveryKind()
    {
        const auto ranges = parseProvenance(R"([
            {"start": 0, "end": 32, "kind": "prefix_cache", "blocks": [17, 18]},
            {"start": 32, "end": 64, "kind": "external", "connector": "LMCacheConnectorV1"},
            {"start": 64, "end": 96, "kind": "prefill", "chunk": 1},
            {"start": 96, "end": 97, "kind": "decode", "step": 0},
            {"start": 97, "end": 98, "kind": "decode", "step": 1},
            {"start": 98, "end": 100, "kind": "spec_accepted", "step": 2},
            {"start": 100, "end": 101, "kind": "recomputed", "preemption": 0},
            {"start": 110, "end": 120, "kind": "unknown"}])",
                                            120);
        QCOMPARE(ranges.size(), std::size_t(8));
        QCOMPARE(ranges[0].kind, ProvenanceKind::PrefixCache);
        QCOMPARE(ranges[0].blocks, (std::vector<std::int64_t>{17, 18}));
        QCOMPARE(ranges[1].connector, std::string("LMCacheConnectorV1"));
        QCOMPARE(*ranges[2].chunk, std::int64_t(1));
        QCOMPARE(*ranges[4].step, std::int64_t(1));
        QCOMPARE(*ranges[6].preemption, std::int64_t(0));
        QCOMPARE(provenanceAt(ranges, 40)->kind, ProvenanceKind::External);
        QCOMPARE(provenanceAt(ranges, 96)->kind, ProvenanceKind::Decode);
        QVERIFY(!provenanceAt(ranges, 105));  // not covered: unknown
        const std::vector<std::string> lines = describeProvenance(ranges);
        QCOMPARE(lines, (std::vector<std::string>{"0-31 prefix_cache (blocks 17-18)", "32-63 external (LMCacheConnectorV1)",
                                                  "64-95 prefill (chunk 1)", "96-97 decode (steps 0-1)",
                                                  "98-99 spec_accepted (step 2)", "100 recomputed (after preemption 0)",
                                                  "110-119 unknown"}));
    }

    void refusesWhatIsWrong_data()
    {
        QTest::addColumn<QString>("json");
        QTest::addColumn<QString>("says");
        QTest::newRow("not JSON") << "[{" << "not JSON";
        QTest::newRow("not a list") << R"({"start": 0})" << "a list of ranges";
        QTest::newRow("no end") << R"([{"start": 0, "kind": "prefill"}])" << "integer 'start' and 'end'";
        QTest::newRow("empty") << R"([{"start": 4, "end": 4, "kind": "prefill"}])" << "not within the prompt's 20 positions";
        QTest::newRow("past the end") << R"([{"start": 0, "end": 21, "kind": "prefill"}])" << "not within the prompt's 20 positions";
        QTest::newRow("overlap") << R"([{"start": 0, "end": 8, "kind": "prefill"}, {"start": 7, "end": 9, "kind": "decode"}])"
                                 << "before the previous range ends (8)";
        QTest::newRow("kind") << R"([{"start": 0, "end": 8, "kind": "lmcache"}])" << "kind 'lmcache' is not one of";
        QTest::newRow("external unnamed") << R"([{"start": 0, "end": 8, "kind": "external"}])" << "names its 'connector'";
        QTest::newRow("blocks") << R"([{"start": 0, "end": 8, "kind": "prefix_cache", "blocks": [-1]}])" << "non-negative block ids";
        QTest::newRow("step") << R"([{"start": 0, "end": 8, "kind": "decode", "step": "one"}])" << "'step' must be a non-negative integer";
    }

    void refusesWhatIsWrong()
    {
        QFETCH(QString, json);
        QFETCH(QString, says);
        try {
            parseProvenance(json.toStdString(), 20);
            QFAIL("accepted");
        } catch (const std::invalid_argument& e) {
            QVERIFY2(QString(e.what()).contains(says), e.what());
        }
    }

    void theReaderReadsItAndTheWriterRefusesABadOne()
    {
        QTemporaryDir dir;
        const std::string path = dir.filePath("p.h5").toStdString();
        SyntheticCaptureOptions o;
        o.layers = 2;
        o.promptLens = {24, 32};
        o.decodeTokens = 4;
        o.provenance = {R"([{"start": 0, "end": 16, "kind": "prefix_cache", "blocks": [3]},
                            {"start": 16, "end": 24, "kind": "prefill", "chunk": 0},
                            {"start": 24, "end": 28, "kind": "decode", "step": 0}])"};
        writeSyntheticCapture(path, o);
        const BundleReader reader(path);
        const PromptInfo& recorded = reader.prompt("prompt_0");
        QCOMPARE(recorded.provenance.size(), std::size_t(3));
        QCOMPARE(recorded.provenance[0].blocks, (std::vector<std::int64_t>{3}));
        QCOMPARE(*recorded.provenance[2].step, std::int64_t(0));
        QVERIFY(reader.prompt("prompt_1").provenance.empty());
        // Past the prompt's 28 positions: the writer says so, naming the prompt.
        o.provenance = {R"([{"start": 0, "end": 99, "kind": "prefill"}])"};
        try {
            writeSyntheticCapture(dir.filePath("bad.h5").toStdString(), o);
            QFAIL("written");
        } catch (const std::exception& e) {
            QVERIFY2(QString(e.what()).contains("/prompts/prompt_0") &&
                         QString(e.what()).contains("attribute 'provenance': range 0: positions 0-99"),
                     e.what());
        }
    }
};

QTEST_GUILESS_MAIN(TestProvenance)
#include "tst_provenance.moc"
