// Results files: an analysis kept. What is read back is the analysis itself, bit for bit
// (every array compared with the original, NaN patterns included) and the JSON exported from
// it equals the JSON of the bundle; written as the analysis streams or all at once; the bundle
// found where it was or beside the file, and never one that is not the bundle analysed; a
// damaged, cut or foreign file is refused by name, never read as other numbers; the commands
// (analyze, check, diff) take it; files of older formats open to the analysis they kept.

#include "analysis/analysis_json.h"
#include "format/bundle_error.h"
#include "kv/capture_loader.h"
#include "format/bundle_outline.h"
#include "format/hdf5_file.h"
#include "results/analysis_input.h"
#include "results/record_upgrade.h"
#include "results/results_file.h"
#include "results/results_writer.h"
#include "results/stored_map.h"
#include "results/synthetic_results.h"
#include "small_model.h"
#include "util/json_writer.h"

#include <hdf5.h>

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

bool sameBits(const SpillableArray& a, const SpillableArray& b)
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

// Results files of older formats kept as test data (this suite is given no data folder: beside its source).
std::string testData(const std::string& name)
{
    return (std::filesystem::path(__FILE__).parent_path().parent_path().parent_path() / "data" / "results_v2" / name).string();
}

std::int64_t formatVersionOf(const std::string& file)
{
    const std::lock_guard lock(hdf5Mutex());
    return Hdf5File::openReadOnly(file).readIntAttribute("/", "format_version");
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
    void storedMapsHoldTheWorstOfTheirTokens();
    void damagedMapsAreNamed();
    void bundleFoundOrNamedMissing();
    void unfinishedFileDoesNotExist();
    void damagedFilesAreRefused();
    void commandsTakeResults();
    void outputsAreCheckedBeforeWork();
    void olderFormatsOpen_data();
    void olderFormatsOpen();
    void formatOneRecordUpgrades();

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
    // Some analysed with their results in temporary files (as 80 layers x 128k tokens are), written a layer at a time.
    const bool spilled = fault == int(FaultKind::Fp8Scale) || fault == int(FaultKind::LostWrite);
    options.resultsInMemoryBytes = spilled ? 1 : 0;
    const AnalysisResult analysed = analyzeAndSave(std::make_shared<BundleReader>(bundle), options, results);
    QCOMPARE(analysed.prompts.front().metrics[0].spilled(), spilled);
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
    // Read into temporary files, a layer at a time, when larger than what results may take in memory.
    qputenv("KVSCOPE_RESULTS_IN_MEMORY_MB", "0");
    const ResultsFile spilled = readResultsFile(path("long.kvres"));
    qunsetenv("KVSCOPE_RESULTS_IN_MEMORY_MB");
    QVERIFY(spilled.result.prompts.front().metrics[0].spilled() && spilled.result.prompts.front().quantL2[1].spilled());
    compareResults(result, spilled.result);
}

namespace {

bool sameFloat(float a, float b)
{
    return (std::isnan(a) && std::isnan(b)) || a == b;
}

// Every shown column of a stored map's window against the cells themselves: the worst value of
// its tokens (max, or min for BC; NaN only where none has data), and a head behind it.
void checkWindow(const PromptAnalysis& p, const HeatmapSpec& spec, const HeatmapGrid& w, std::int64_t from,
                 std::int64_t to, std::int64_t maxColumns)
{
    QVERIFY(w.columns <= maxColumns && w.columns > 0);
    QCOMPARE(w.rows, int(p.layers.size()));
    QVERIFY(w.firstToken <= from && w.firstToken + w.columns * w.tokensPerColumn >= std::min(to, p.tokens));
    const bool lowerWorse = spec.metric == HeatmapMetric::Bc || spec.metric == HeatmapMetric::BcVsNoise;
    for (int l = 0; l < w.rows; ++l)
        for (std::int64_t c = 0; c < w.columns; ++c) {
            float worst = std::nanf("");
            std::vector<int> heads;  // of the tokens holding the worst value
            for (std::int64_t t = w.firstToken + c * w.tokensPerColumn;
                 t < std::min(p.tokens, w.firstToken + (c + 1) * w.tokensPerColumn); ++t) {
                int head = -1;
                const float v = heatmapValue(p, spec, l, t, &head);
                if (std::isnan(v))
                    continue;
                if (std::isnan(worst) || (lowerWorse ? v < worst : v > worst)) {
                    worst = v;
                    heads.clear();
                }
                if (v == worst)
                    heads.push_back(head);
            }
            QVERIFY2(sameFloat(w.at(l, c), worst),
                     qPrintable(QString("layer %1 column %2: %3, the cells' worst %4").arg(l).arg(c).arg(w.at(l, c)).arg(worst)));
            if (!std::isnan(worst))
                QVERIFY(std::find(heads.begin(), heads.end(), int(w.headAt(l, c))) != heads.end());
        }
}

}  // namespace

void TestResultsFile::storedMapsHoldTheWorstOfTheirTokens()
{
    // Three-way with suspects, two-way, 20,000 tokens (levels down to 625 columns), and results
    // made without a capture (synth --results): every map kept, windows at every zoom, against
    // the cells.
    writeSyntheticResults(path("synthetic.kvres"), SyntheticResultsOptions{8, 3000, 4, true, 3});
    for (const std::string name : {"k_scale", "two_way", "long", "synthetic"}) {
        const std::string file = path(name + ".kvres");
        const ResultsFile r = readResultsFile(file);
        for (std::size_t i = 0; i < r.result.prompts.size(); ++i) {
            const PromptAnalysis& p = r.result.prompts[i];
            const std::vector<HeatmapSpec> specs = storedMapSpecs(p, r.options);
            QCOMPARE(specs.size(), std::size_t(p.threeWay ? 12 : 6));
            for (const HeatmapSpec& spec : specs) {
                const std::optional<StoredMap> map = StoredMap::open(file, i, spec, int(p.layers.size()), p.tokens);
                QVERIFY2(map, qPrintable(QString::fromStdString(results_path::map(i, spec))));
                const std::vector<std::array<std::int64_t, 3>> windows{
                    {0, p.tokens, 1000}, {0, p.tokens, 7}, {0, p.tokens, p.tokens}, {p.tokens / 3, p.tokens / 3 + 50, 1000},
                    {p.tokens / 2, p.tokens / 2 + 300, 40}, {p.tokens - 5, p.tokens + 10, 100}};
                for (const auto& [from, to, columns] : windows)
                    checkWindow(p, spec, map->window(from, to, columns), from, to, columns);
                if (scaleOf(spec.metric) == ScaleKind::Error)  // the range the data gives, as the arrays give it
                    for (const bool logarithmic : {false, true}) {
                        const ValueRange kept = *map->dataRange(logarithmic), fromCells = dataRange(p, spec, logarithmic);
                        QCOMPARE(kept.lower, fromCells.lower);
                        QCOMPARE(kept.upper, fromCells.upper);
                    }
                else
                    QVERIFY(!map->dataRange(false));
            }
            // The mean over heads and one head are not kept: built from the arrays.
            for (const HeadReductionKind reduction : {HeadReductionKind::Mean, HeadReductionKind::OneHead})
                QVERIFY(!StoredMap::open(file, i, HeatmapSpec{HeatmapMetric::RelLinf, KvPart::K, reduction, 0},
                                         int(p.layers.size()), p.tokens));
        }
    }
    QCOMPARE(storedMapLevels(20000), 6);  // 20000, 10000, 5000, 2500, 1250, 625 columns
    QCOMPARE(storedMapLevels(1024), 1);
    QCOMPARE(storedMapLevels(1025), 2);
}

void TestResultsFile::damagedMapsAreNamed()
{
    // A level taken out of a copy: opening the map names the dataset missing.
    const std::string file = path("map_damaged.kvres");
    std::filesystem::copy_file(path("long.kvres"), file, std::filesystem::copy_options::overwrite_existing);
    const HeatmapSpec spec{HeatmapMetric::RelL2, KvPart::V, HeadReductionKind::Max, 0};
    const std::string level = results_path::map(1, spec) + "/values_3";
    {
        const hid_t f = H5Fopen(file.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
        QVERIFY(f >= 0);
        QVERIFY(H5Ldelete(f, level.c_str(), H5P_DEFAULT) >= 0);
        H5Fclose(f);
    }
    try {
        StoredMap::open(file, 1, spec, 2, 20000);
        QFAIL("a map without one of its levels was opened");
    } catch (const BundleError& e) {
        QVERIFY2(std::string(e.what()).find(file) != std::string::npos && std::string(e.what()).find(level) != std::string::npos,
                 e.what());
    }
    // Its other maps still open.
    QVERIFY(StoredMap::open(file, 1, HeatmapSpec{HeatmapMetric::RelL2, KvPart::K, HeadReductionKind::Max, 0}, 2, 20000));
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
    // A flipped byte anywhere: refused by name, or (in bytes nothing reads) the same analysis
    // and maps.
    int refused = 0;
    for (int k = 1; k < 16; ++k) {
        std::string damaged = bytes;
        damaged[std::size_t(size * k / 16)] ^= 0x5a;
        const std::string file = path("flipped.kvres");
        std::ofstream(file, std::ios::binary) << damaged;
        try {
            const ResultsFile read = readResultsFile(file);
            compareResults(original, read.result);
            // The maps too, at every level (their checksums are checked as windows are read).
            for (std::size_t i = 0; i < read.result.prompts.size(); ++i) {
                const PromptAnalysis& p = read.result.prompts[i];
                for (const HeatmapSpec& spec : storedMapSpecs(p, read.options))
                    if (const auto map = StoredMap::open(file, i, spec, int(p.layers.size()), p.tokens))
                        for (std::int64_t columns = p.tokens; columns >= 1; columns /= 2)
                            map->window(0, p.tokens, columns);
            }
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
    // An outline whose prompt has no engine snapshot (nothing a bundle may hold): refused by field.
    {
        BundleOutline outline = BundleReader(path("fp8.h5")).outline();
        outline.prompts.front().snapshots.clear();
        std::ostringstream text;
        JsonWriter w(text);
        writeOutlineJson(w, outline);
        const JsonFields fields("outline.json");
        try {
            readOutlineJson(fields, JsonFields::Json::parse(text.str()), "");
            QFAIL("an outline without snapshots was read");
        } catch (const BundleError& e) {
            QVERIFY2(std::string(e.what()).find("snapshots") != std::string::npos, e.what());
        }
    }
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

void TestResultsFile::olderFormatsOpen_data()
{
    QTest::addColumn<QString>("name");
    QTest::addColumn<bool>("threeWay");
    // kvscope synth --layers 4 --prompts 8,12 --decode 2 --state-space-layers 2 --kv-dtype fp8_e4m3
    //   --kv-scale head --fault fp8_scale --fault-layer 1 (a not-compared layer, a suspect, scales)
    QTest::newRow("format 2, three-way, fp8 with per-head scales") << "v2_fp8" << true;
    // kvscope synth --layers 3 --prompts 8,12 --decode 2 --two-way --fault k_negated --fault-layer 1
    QTest::newRow("format 2, two-way") << "v2_two_way" << false;
}

// A results file of format 2 (tests/data/results_v2: written by kvscope before format 3, with
// the analysis JSON it wrote of the same bundle) opens to that analysis, and saved again (format
// 3) reads back the same.
void TestResultsFile::olderFormatsOpen()
{
    QFETCH(QString, name);
    QFETCH(bool, threeWay);
    const std::string file = testData(name.toStdString() + ".kvres");
    QCOMPARE(formatVersionOf(file), std::int64_t(2));
    const ResultsFile old = readResultsFile(file);
    std::ifstream in(testData(name.toStdString() + ".json"), std::ios::binary);
    const std::string writtenThen((std::istreambuf_iterator<char>(in)), {});
    QVERIFY(!writtenThen.empty());
    QVERIFY2(jsonOf(old.result) == writtenThen, "the analysis of a format 2 file is not the one kvscope wrote then");
    // What the JSON does not show, as the captures were made: 2 KV heads, an fp8 scale each (or bf16).
    QCOMPARE(old.result.prompts.size(), std::size_t(2));
    for (const PromptAnalysis& p : old.result.prompts) {
        QCOMPARE(p.threeWay, threeWay);
        QCOMPARE(p.layers.size(), std::size_t(3));
        for (std::size_t l = 0; l < p.layers.size(); ++l) {
            QCOMPARE(int(p.layerDtypes[l]), int(threeWay ? DType::Float8E4M3 : DType::BFloat16));
            QCOMPARE(int(p.cacheScales[l].granularity), int(threeWay ? ScaleGranularity::Head : ScaleGranularity::Tensor));
            QCOMPARE(p.cacheScales[l].heads[0].size(), std::size_t(threeWay ? 2 : 0));
            QCOMPARE(p.cacheScales[l].heads[1].size(), std::size_t(threeWay ? 2 : 0));
        }
    }
    QCOMPARE(old.result.aggregate.has_value(), threeWay);
    QVERIFY(old.options.suspects == SuspectThresholds{});

    const std::string again = path(name.toStdString() + "_again.kvres");
    saveResults(again, old.bundle->outline(), old.result, old.options);
    QCOMPARE(formatVersionOf(again), std::int64_t(kResultsFormatVersion));
    const ResultsFile now = readResultsFile(again);
    compareResults(old.result, now.result);
    QVERIFY(now.options.suspects == old.options.suspects);
}

// A record as format 1 wrote it (by hand): its names upgraded, the one reader reads it, its
// aggregate's BCs by generation index (flat, in the record) included.
void TestResultsFile::formatOneRecordUpgrades()
{
    const JsonFields::Json v1 = JsonFields::Json::parse(R"({
        "bundle": "b.h5",
        "options": {"search_suspects": true, "bc": true, "unreadable_blocks": "absent",
                    "suspect_thresholds": {"off_floor": 6, "per_decade": 2.6, "two_way_drift": 20,
                                           "two_way_drift_per_decade": 4, "min_cells": 3, "explained": 2}},
        "problems": [], "not_compared": [["model.layers.1.mamba", "state-space layers"]], "suspects": [],
        "prompts": [{"id": "p0", "input_ids": [3, 4],
                     "reference_fingerprints": [["00000000000000aa", "00000000000000bb"], ["00000000000000cc", "00000000000000dd"]],
                     "prompt_len": 2, "tokens": 3, "heads": 2, "layer_heads": [2, 1], "dims": [16, 8],
                     "layer_dims": [[16, 8], [32, 32]], "part_names": ["k", "v"], "three_way": true,
                     "layers": ["l0", "l2"], "layer_groups": [0, 1], "layer_dtypes": ["bfloat16", "bfloat16"],
                     "cache_scales": [{"granularity": "tensor", "k": [], "v": []}, {"granularity": "tensor", "k": [], "v": []}],
                     "divergences": [], "non_finite": [], "problems": [], "replica_differences": [], "suspects": []}],
        "aggregate": {"prompt_ids": ["p0"], "layers": ["l0", "l2"], "generation_count": 3, "divergence_counts": [0, 1, 0],
                      "bc": [[0.5, 0.25, null, 1, 2, 3], [4, 5, 6, 7, 8, 9]], "combined": [[0.875, 0.75], [0.625, 0.5]],
                      "bc_vs_noise": [[1, 2, 3, 4, 5, 6], [7, 8, 9, 10, 11, null]],
                      "combined_vs_noise": [[0.125, 0.25], [0.375, null]]}})");
    const JsonFields f("v1");
    RecordedOptions options;
    QVERIFY_THROWS_EXCEPTION(BundleError, readAnalysisRecord(f, v1, options));  // (format 3 names them otherwise)
    JsonFields::Json upgraded = v1;
    upgradeRecordToV3(upgraded, 1);
    const AnalysisResult r = readAnalysisRecord(f, upgraded, options);
    QVERIFY((r.notCompared == std::vector<std::pair<std::string, std::string>>{{"model.layers.1.mamba", "state-space layers"}}));
    QCOMPARE(options.suspects.falseLayerChance, 0.0);  // (before the noise count: not applied)
    QCOMPARE(r.prompts.size(), std::size_t(1));
    const PromptAnalysis& p = r.prompts.front();
    QVERIFY(p.threeWay);
    QCOMPARE(p.tokens, std::int64_t(3));
    QCOMPARE(p.heads, 2);
    QVERIFY(p.dims == HeadDims(16, 8));
    QVERIFY((p.layerDims == std::vector<HeadDims>{HeadDims(16, 8), HeadDims(32)}));
    QCOMPARE(p.layers, (std::vector<std::string>{"l0", "l2"}));
    QCOMPARE(p.referenceHashes[0], (std::vector<std::uint64_t>{0xaa, 0xbb}));
    QCOMPARE(p.referenceHashes[1], (std::vector<std::uint64_t>{0xcc, 0xdd}));
    QVERIFY(r.aggregate);
    const AggregateBc& a = *r.aggregate;
    QCOMPARE(a.generationCount, std::int64_t(3));
    QCOMPARE(a.layers, (std::vector<std::string>{"l0", "l2"}));
    QCOMPARE(a.bc[1], (std::vector<float>{4, 5, 6, 7, 8, 9}));
    QVERIFY(a.bc[0].size() == 6 && a.bc[0][1] == 0.25f && std::isnan(a.bc[0][2]) && a.bc[0][5] == 3.0f);
    QVERIFY(a.bcVsNoise[1].size() == 6 && a.bcVsNoise[1][0] == 7.0f && std::isnan(a.bcVsNoise[1][5]));
    QCOMPARE(a.combined[0], (std::vector<float>{0.875f, 0.75f}));
    QCOMPARE(a.combined[1], (std::vector<float>{0.625f, 0.5f}));
    QVERIFY(a.combinedVsNoise[1][0] == 0.375f && std::isnan(a.combinedVsNoise[1][1]));
}

QTEST_GUILESS_MAIN(TestResultsFile)
#include "tst_results_file.moc"
