// Results files: an analysis kept. What is read back is the analysis itself, bit for bit
// (every array compared with the original, NaN patterns included) and the JSON exported from
// it equals the JSON of the bundle; written as the analysis streams or all at once; the bundle
// found where it was or beside the file, and never one that is not the bundle analysed; a
// damaged, cut or foreign file is refused by name, never read as other numbers; the commands
// (analyze, check, diff) take it.

#include "analysis/analysis_json.h"
#include "format/bundle_error.h"
#include "kv/capture_loader.h"
#include "results/analysis_input.h"
#include "results/results_file.h"
#include "results/results_writer.h"
#include "small_model.h"

#include <QFile>
#include <QProcess>
#include <QTemporaryDir>
#include <QTest>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

using namespace kvscope;
using namespace kvscope::synth;
using namespace kvtest;

namespace {

std::string jsonOf(const AnalysisResult& result)
{
    std::ostringstream out;
    writeAnalysisJson(result, out);
    return out.str();
}

bool sameBits(const FloatBuffer& a, const FloatBuffer& b)
{
    return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

// Every array and every field the JSON does not show (scales, quantisation floors).
void compareResults(const AnalysisResult& a, const AnalysisResult& b)
{
    QCOMPARE(jsonOf(b), jsonOf(a));
    QCOMPARE(b.prompts.size(), a.prompts.size());
    for (std::size_t i = 0; i < a.prompts.size(); ++i) {
        const PromptAnalysis &p = a.prompts[i], &q = b.prompts[i];
        for (int m = 0; m < kMetricCount; ++m)
            QVERIFY2(sameBits(p.metrics[std::size_t(m)], q.metrics[std::size_t(m)]), metricName(Metric(m)));
        for (std::size_t part = 0; part < 2; ++part) {
            QVERIFY(sameBits(p.bc[part], q.bc[part]));
            QVERIFY(sameBits(p.bcVsNoise[part], q.bcVsNoise[part]));
            QVERIFY(sameBits(p.quantLinf[part], q.quantLinf[part]));
            QVERIFY(sameBits(p.quantL2[part], q.quantL2[part]));
        }
        QCOMPARE(q.layerDtypes, p.layerDtypes);
        QCOMPARE(q.cacheScales.size(), p.cacheScales.size());
        for (std::size_t l = 0; l < p.cacheScales.size(); ++l) {
            QCOMPARE(int(q.cacheScales[l].granularity), int(p.cacheScales[l].granularity));
            QCOMPARE(q.cacheScales[l].heads[0], p.cacheScales[l].heads[0]);
            QCOMPARE(q.cacheScales[l].heads[1], p.cacheScales[l].heads[1]);
        }
    }
}

int run(const QStringList& args, QString* out = nullptr)
{
    QProcess p;
    p.start(KVSCOPE_BINARY, args);
    p.waitForFinished(120000);
    if (out)
        *out = QString::fromUtf8(p.readAllStandardOutput() + p.readAllStandardError());
    return p.exitCode();
}

}  // namespace

class TestResultsFile : public QObject {
    Q_OBJECT

private slots:
    void initTestCase() { QVERIFY(m_dir.isValid()); }
    void roundTrip_data();
    void roundTrip();
    void savedAtOnceEqualsStreamed();
    void longPromptsSpanChunks();
    void bundleFoundOrNamedMissing();
    void unfinishedFileDoesNotExist();
    void damagedFilesAreRefused();
    void commandsTakeResults();
    void outputsAreCheckedBeforeWork();

private:
    std::string path(const std::string& name) const { return m_dir.filePath(QString::fromStdString(name)).toStdString(); }
    QTemporaryDir m_dir;
};

void TestResultsFile::roundTrip_data()
{
    QTest::addColumn<QString>("name");
    QTest::addColumn<int>("fault");
    QTest::addColumn<bool>("baseline");
    QTest::addColumn<int>("kvHeads");
    QTest::addColumn<bool>("someLayers");
    QTest::newRow("three-way, a head's K halved (suspect, hypothesis)") << "k_scale" << int(FaultKind::HeadKScale) << true << 4 << false;
    QTest::newRow("fp8 cache, scale twice the true one (floors, scales)") << "fp8" << int(FaultKind::Fp8Scale) << true << 4 << false;
    QTest::newRow("two-way, a lost write") << "two_way" << int(FaultKind::LostWrite) << false << 4 << false;
    QTest::newRow("replicated head, a replica differs") << "replica" << int(FaultKind::ReplicaDiff) << true << 1 << false;
    QTest::newRow("clean, layers 1-3 only") << "subset" << int(FaultKind::None) << true << 4 << true;
}

void TestResultsFile::roundTrip()
{
    QFETCH(QString, name);
    QFETCH(int, fault);
    QFETCH(bool, baseline);
    QFETCH(int, kvHeads);
    QFETCH(bool, someLayers);
    ModelCaptureOptions o = smallModel(FaultKind(fault));
    o.baseline = baseline;
    o.shape.kvHeads = kvHeads;
    const std::string bundle = path(name.toStdString() + ".h5"), results = path(name.toStdString() + ".kvres");
    writeModelCapture(bundle, o);
    AnalysisOptions options;
    if (someLayers) {
        const std::vector<std::string> names = BundleReader(bundle).config().layerNames();
        options.layers = {names[1], names[2], names[3]};
    }
    const AnalysisResult analysed = analyzeAndSave(std::make_shared<BundleReader>(bundle), options, results);
    if (fault == int(FaultKind::Fp8Scale))
        QVERIFY(analysed.prompts.front().hasQuantisedLayers());
    if (fault == int(FaultKind::ReplicaDiff))
        QVERIFY(!analysed.prompts.front().replicaDifferences.empty());
    if (fault == int(FaultKind::HeadKScale))
        QVERIFY(!analysed.suspects.empty() && !analysed.suspects.front().hypothesis.kind.empty());
    const ResultsFile read = readResultsFile(results);
    compareResults(analysed, read.result);
    QVERIFY(read.bundle->holdsData());
    QVERIFY(read.bundleMissing.empty());
    QCOMPARE(read.bundlePath, std::filesystem::absolute(bundle).lexically_normal().string());
    QVERIFY(read.options.suspects == options.suspects);
}

void TestResultsFile::savedAtOnceEqualsStreamed()
{
    const std::string bundle = path("k_scale.h5");
    const ResultsFile streamed = readResultsFile(path("k_scale.kvres"));
    saveResults(path("at_once.kvres"), BundleReader(bundle).outline(), streamed.result, streamed.options);
    compareResults(streamed.result, readResultsFile(path("at_once.kvres")).result);
}

void TestResultsFile::longPromptsSpanChunks()
{
    // Prompts longer than a chunk (4096 tokens of a [layer][token][head] array, 16384 of a
    // [layer][token] one), ending inside one: every value read back, the padding never.
    AnalysisResult result;
    result.bundle = "long.h5";
    for (std::int64_t tokens : {std::int64_t(4096), std::int64_t(20000)}) {
        PromptAnalysis p;
        p.id = "p" + std::to_string(tokens);
        p.tokens = tokens;
        p.heads = 3;
        p.threeWay = true;
        p.layers = {"a", "b"};
        p.layerHeads = {3, 2};
        p.layerDims = {HeadDims(16), HeadDims(16)};
        p.layerGroups = {0, 0};
        p.layerDtypes = {DType::Float8E4M3, DType::BFloat16};
        p.referenceHashes = {std::vector<std::uint64_t>{1, 2}, std::vector<std::uint64_t>{3, 4}};
        p.allocate();
        std::uint32_t state = 12345;
        auto next = [&state] { return float((state = state * 1664525u + 1013904223u) >> 8) / float(1 << 24); };
        for (auto& m : p.metrics)
            for (float& x : m)
                x = next() < 0.1f ? std::nanf("") : next();
        for (auto* pair : {&p.bc, &p.bcVsNoise, &p.quantLinf, &p.quantL2})
            for (auto& b : *pair)
                for (float& x : b)
                    x = next();
        result.prompts.push_back(std::move(p));
    }
    saveResults(path("long.kvres"), BundleReader(path("fp8.h5")).outline(), result, {});
    compareResults(result, readResultsFile(path("long.kvres")).result);
}

void TestResultsFile::bundleFoundOrNamedMissing()
{
    const std::string moved = path("moved");
    std::filesystem::create_directories(moved);
    std::filesystem::copy_file(path("k_scale.kvres"), moved + "/k_scale.kvres");
    // Still where it was analysed.
    QVERIFY(readResultsFile(moved + "/k_scale.kvres").bundle->holdsData());
    // Gone: the outline stands in, and reads of data say why.
    std::filesystem::rename(path("k_scale.h5"), path("k_scale.away"));
    const ResultsFile alone = readResultsFile(moved + "/k_scale.kvres");
    QVERIFY(!alone.bundle->holdsData());
    QVERIFY2(alone.bundleMissing.find("not at") != std::string::npos, alone.bundleMissing.c_str());
    QCOMPARE(alone.bundle->prompts().size(), std::size_t(2));
    QCOMPARE(alone.bundle->config().json, BundleReader(path("k_scale.away")).config().json);
    try {
        CaptureLoader(alone.bundle).engineLayer(alone.result.prompts.front().id, alone.result.prompts.front().layers.front());
        QFAIL("KV read from a results file without its bundle");
    } catch (const BundleError& e) {
        QVERIFY2(std::string(e.what()).find("not at hand") != std::string::npos, e.what());
    }
    // The report from it alone: everything but what needs the KV, and it says so.
    const QString report = QString::fromStdString(moved + "/report");
    QString text;
    QCOMPARE(run({"report", QString::fromStdString(moved + "/k_scale.kvres"), "-o", report}, &text), 0);
    QFile html(report + "/report.html");
    QVERIFY(html.open(QIODevice::ReadOnly));
    const QString page = QString::fromUtf8(html.readAll());
    QVERIFY(page.contains("Read from a saved analysis") && page.contains("<h2>Verdict</h2>") &&
            page.contains("<h2>Capture</h2>") && !page.contains("What if the cache were quantised"));
    QVERIFY2(text.contains("no what-if section"), qPrintable(text));
    // Beside the results file, under its own name.
    std::filesystem::copy_file(path("k_scale.away"), moved + "/k_scale.h5");
    QVERIFY(readResultsFile(moved + "/k_scale.kvres").bundle->holdsData());
    // Another capture under the bundle's name is not the bundle analysed.
    std::filesystem::remove(moved + "/k_scale.h5");
    ModelCaptureOptions other = smallModel(FaultKind::HeadKScale);
    other.seed += 1;
    writeModelCapture(path("k_scale.h5"), other);
    const ResultsFile impostor = readResultsFile(moved + "/k_scale.kvres");
    QVERIFY(!impostor.bundle->holdsData());
    QVERIFY2(impostor.bundleMissing.find("not the bundle analysed") != std::string::npos, impostor.bundleMissing.c_str());
    std::filesystem::rename(path("k_scale.away"), path("k_scale.h5"));
}

void TestResultsFile::unfinishedFileDoesNotExist()
{
    // A writer abandoned (a cancelled or failed analysis) leaves no file, finished or partial.
    const auto reader = std::make_shared<BundleReader>(path("fp8.h5"));
    const AnalysisResult prepared = prepareAnalysis(CaptureLoader(reader), {});
    {
        ResultsWriter writer(path("abandoned.kvres"), reader->outline(), prepared, recordedOptions({}));
        writer.writeLayer(prepared, 0);
    }
    QVERIFY(!std::filesystem::exists(path("abandoned.kvres")));
    QVERIFY(!std::filesystem::exists(path("abandoned.kvres.partial")));
}

void TestResultsFile::damagedFilesAreRefused()
{
    const std::string good = path("fp8.kvres");
    const AnalysisResult original = readResultsFile(good).result;
    const auto size = std::filesystem::file_size(good);
    std::ifstream in(good, std::ios::binary);
    const std::string bytes((std::istreambuf_iterator<char>(in)), {});
    // A flipped byte anywhere: refused by name, or (in bytes nothing reads) the same analysis.
    int refused = 0;
    for (int k = 1; k < 16; ++k) {
        std::string damaged = bytes;
        damaged[std::size_t(size * k / 16)] ^= 0x5a;
        const std::string file = path("flipped.kvres");
        std::ofstream(file, std::ios::binary) << damaged;
        try {
            compareResults(original, readResultsFile(file).result);
        } catch (const BundleError& e) {
            QVERIFY2(std::string(e.what()).find(file) != std::string::npos, e.what());
            ++refused;
        }
    }
    QVERIFY2(refused >= 12, qPrintable(QString::number(refused)));
    // Cut short.
    std::ofstream(path("cut.kvres"), std::ios::binary) << bytes.substr(0, bytes.size() / 2);
    QVERIFY_THROWS_EXCEPTION(BundleError, readResultsFile(path("cut.kvres")));
    // Not HDF5 at all: named .kvres, it is read as a results file and refused as one.
    std::ofstream(path("garbage.kvres"), std::ios::binary) << std::string(4096, 'x');
    QVERIFY(isResultsFile(path("garbage.kvres")));
    QVERIFY_THROWS_EXCEPTION(BundleError, readResultsFile(path("garbage.kvres")));
    // A bundle is not a results file.
    QVERIFY(!isResultsFile(path("fp8.h5")));
    QVERIFY(isResultsFile(good));
    try {
        readResultsFile(path("fp8.h5"));
        QFAIL("a bundle read as results");
    } catch (const BundleError& e) {
        QVERIFY2(std::string(e.what()).find("not a kvscope results file") != std::string::npos, e.what());
    }
}

void TestResultsFile::commandsTakeResults()
{
    const QString bundle = QString::fromStdString(path("k_scale.h5")), results = QString::fromStdString(path("cli.kvres"));
    const QString fromBundle = QString::fromStdString(path("cli_bundle.json")), fromResults = QString::fromStdString(path("cli_results.json"));
    QCOMPARE(run({"analyze", bundle, "--json", fromBundle, "--save", results}), 0);
    QCOMPARE(run({"analyze", results, "--json", fromResults}), 0);
    std::ifstream a(fromBundle.toStdString(), std::ios::binary), b(fromResults.toStdString(), std::ios::binary);
    const std::string ja((std::istreambuf_iterator<char>(a)), {}), jb((std::istreambuf_iterator<char>(b)), {});
    QVERIFY(!ja.empty());
    QVERIFY2(ja == jb, "the JSON exported from the results file differs from the bundle's");
    // check gives the bundle's verdict, and refuses other suspect thresholds than the saved ones.
    QString checkBundle, checkResults, text;
    QCOMPARE(run({"check", bundle}, &checkBundle), 1);
    QCOMPARE(run({"check", results}, &checkResults), 1);
    QCOMPARE(checkResults.section('\n', 1), checkBundle.section('\n', 1));
    QCOMPARE(run({"check", results, "--suspect-floor", "5"}, &text), 2);
    QVERIFY2(text.contains("suspect thresholds"), qPrintable(text));
    // diff: a results file stands for A, and for B.
    QCOMPARE(run({"diff", results, bundle}, &text), 0);
    QVERIFY2(text.contains("(analysis)") && text.contains("3 matched") == false && text.contains("2 matched"), qPrintable(text));
    QCOMPARE(run({"diff", bundle, results}, &text), 0);
    QVERIFY2(text.contains("-> B " + results), qPrintable(text));  // B as given, not its bundle
    QCOMPARE(run({"analyze", results, "--layers", "0"}, &text), 2);
    QCOMPARE(run({"inspect", results}, &text), 0);
    QVERIFY2(text.contains("results file") && text.contains(": at hand") && text.contains("prompt ") &&
                 text.contains("suspect off-floor 6"),
             qPrintable(text));
    // Other suspect thresholds are chosen when analysing, and check then takes the file.
    const QString floor5 = QString::fromStdString(path("floor5.kvres"));
    QCOMPARE(run({"analyze", bundle, "--suspect-floor", "5", "--save", floor5}), 0);
    QCOMPARE(run({"check", floor5, "--suspect-floor", "5"}, &text), 1);
    QVERIFY2(text.contains("FAIL"), qPrintable(text));
    // Commands that need the KV name the results file for what it is.
    QCOMPARE(run({"whatif", results}, &text), 2);
    QVERIFY2(text.contains("is a kvscope results file"), qPrintable(text));
}

void TestResultsFile::outputsAreCheckedBeforeWork()
{
    const QString bundle = QString::fromStdString(path("k_scale.h5")), results = QString::fromStdString(path("cli.kvres"));
    const auto before = std::filesystem::last_write_time(results.toStdString());
    QString text;
    // Never onto the input.
    QCOMPARE(run({"analyze", results, "--json", results}, &text), 2);
    QVERIFY2(text.contains("is the input itself"), qPrintable(text));
    QCOMPARE(run({"analyze", bundle, "--save", bundle}, &text), 2);
    QCOMPARE(run({"export", bundle, bundle}, &text), 2);
    QCOMPARE(std::filesystem::last_write_time(results.toStdString()), before);
    // A folder, or a file in a folder that does not exist: refused at once, with nothing analysed.
    QCOMPARE(run({"analyze", bundle, "--save", QString::fromStdString(m_dir.path().toStdString())}, &text), 2);
    QVERIFY2(text.contains("is a folder") && !text.contains("prompt"), qPrintable(text));
    QCOMPARE(run({"analyze", bundle, "--save", QString::fromStdString(path("no/such/folder.kvres"))}, &text), 2);
    QVERIFY2(text.contains("does not exist"), qPrintable(text));
    // Writing to a stream that exists is fine.
    QCOMPARE(run({"analyze", results, "--json", "/dev/null"}), 0);
}

QTEST_GUILESS_MAIN(TestResultsFile)
#include "tst_results_file.moc"
