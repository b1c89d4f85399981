// A suspect's off positions against the paths the bundle recorded: named when they are exactly
// one path's (and another path's positions are clean), silent otherwise; worked by hand, then on
// a synthetic capture whose fault starts six decode positions in.

#include "analysis/analyzer.h"
#include "analysis/provenance_match.h"
#include "format/bundle_reader.h"
#include "results/results_file.h"
#include "results/results_writer.h"
#include "synth/synthetic_capture.h"

#include <QTemporaryDir>
#include <QTest>

#include <numeric>

using namespace kvscope;

namespace {

std::vector<std::int64_t> span(std::int64_t first, std::int64_t end)
{
    std::vector<std::int64_t> v(std::size_t(end - first));
    std::iota(v.begin(), v.end(), first);
    return v;
}

std::vector<ProvenanceRange> paths()
{
    return parseProvenance(R"([{"start": 0, "end": 32, "kind": "prefix_cache", "blocks": [17, 18]},
                               {"start": 32, "end": 48, "kind": "external", "connector": "NixlConnector"},
                               {"start": 48, "end": 64, "kind": "prefill", "chunk": 2},
                               {"start": 64, "end": 65, "kind": "decode", "step": 0},
                               {"start": 65, "end": 66, "kind": "decode", "step": 1}])",
                           80);
}

}  // namespace

class TestProvenanceMatch : public QObject {
    Q_OBJECT

private slots:
    void oneSourceIsNamed()
    {
        const auto m = matchProvenance(paths(), {33, 40, 47, 35}, span(0, 66));
        QVERIFY(m);
        QCOMPARE(m->kind, ProvenanceKind::External);
        QCOMPARE(m->connector, std::string("NixlConnector"));
        QCOMPARE(m->firstOff, std::int64_t(33));
        QCOMPARE(m->lastOff, std::int64_t(47));
        QCOMPARE(m->text, std::string("Every off position (33-47) was loaded by NixlConnector; the positions that came another "
                                      "way are within the noise."));
        const auto cached = matchProvenance(paths(), {3, 20}, span(0, 66));
        QVERIFY(cached);
        QCOMPARE(cached->text, std::string("Every off position (3-20) was served from the prefix cache (blocks 17-18); the "
                                           "positions that came another way are within the noise."));
        const auto chunk = matchProvenance(paths(), {50}, span(0, 66));
        QVERIFY(chunk);
        QVERIFY2(chunk->text.find("computed here in prefill chunk 2") != std::string::npos, chunk->text.c_str());
    }

    void otherwiseNothingIsSaid()
    {
        QVERIFY(!matchProvenance(paths(), {30, 33}, span(0, 66)));   // two paths
        QVERIFY(!matchProvenance(paths(), {70}, span(0, 80)));       // a position of no recorded path
        QVERIFY(!matchProvenance(paths(), {}, span(0, 66)));
        QVERIFY(!matchProvenance({}, {3}, span(0, 66)));
        // Every analysed position came the one way: the path tells nothing apart.
        QVERIFY(!matchProvenance(paths(), {3, 20}, span(0, 32)));
    }

    void aSyntheticFaultInTheLoadedPositionsIsNamed()
    {
        // The synth's fault: one head's K rotated one position too far from 6 positions after
        // the prompt on, in layer 5. Recorded: the prompt in prefill chunks, then decode; and
        // from prompt + 6 on "loaded by a connector" (as a consumer of a disaggregated prefill
        // whose tail arrived from elsewhere).
        QTemporaryDir dir;
        SyntheticCaptureOptions o = demoCaptureOptions();
        o.promptLens = {40, 56};
        o.divergence = -1;
        const auto json = [&](int promptLen, int loadedFrom) {
            const int end = promptLen + o.decodeTokens;
            return "[{\"start\": 0, \"end\": " + std::to_string(promptLen) + ", \"kind\": \"prefill\", \"chunk\": 0}, " +
                   "{\"start\": " + std::to_string(promptLen) + ", \"end\": " + std::to_string(loadedFrom) +
                   ", \"kind\": \"decode\", \"step\": 0}, {\"start\": " + std::to_string(loadedFrom) + ", \"end\": " +
                   std::to_string(end) + ", \"kind\": \"external\", \"connector\": \"NixlConnector\"}]";
        };
        o.provenance = {json(40, 40 + o.faultPosition), json(56, 56 + o.faultPosition)};
        const std::string aligned = dir.filePath("aligned.h5").toStdString();
        writeSyntheticCapture(aligned, o);
        const AnalysisResult a = analyzeBundle(std::make_shared<BundleReader>(aligned));
        QVERIFY(!a.prompts[0].suspects.empty());
        const Suspect& s = a.prompts[0].suspects.front();
        QVERIFY(s.provenance);
        QCOMPARE(s.provenance->kind, ProvenanceKind::External);
        QVERIFY2(s.evidence.find("was loaded by NixlConnector") != std::string::npos, s.evidence.c_str());
        // Kept by a results file as it was found.
        const std::string results = dir.filePath("aligned.kvres").toStdString();
        auto reader = std::make_shared<BundleReader>(aligned);
        saveResults(results, reader->outline(), a, RecordedOptions{});
        const ResultsFile kept = readResultsFile(results);
        QVERIFY(kept.result.prompts[0].suspects.front().provenance);
        QCOMPARE(kept.result.prompts[0].suspects.front().provenance->text, s.provenance->text);
        QCOMPARE(kept.result.prompts[0].suspects.front().provenance->connector, std::string("NixlConnector"));
        // The connector's positions moved three past the fault's start: the off positions span
        // two paths (decode and the connector), and nothing is said of either.
        o.provenance = {json(40, 40 + o.faultPosition + 3), json(56, 56 + o.faultPosition + 3)};
        const std::string across = dir.filePath("across.h5").toStdString();
        writeSyntheticCapture(across, o);
        const AnalysisResult b = analyzeBundle(std::make_shared<BundleReader>(across));
        QVERIFY(!b.prompts[0].suspects.empty());
        QVERIFY(!b.prompts[0].suspects.front().provenance);
        QVERIFY(b.prompts[0].suspects.front().evidence.find("loaded by") == std::string::npos);
    }
};

QTEST_GUILESS_MAIN(TestProvenanceMatch)
#include "tst_provenance_match.moc"
