// The command line: one option parser for every command (operands, options with and without
// values, numbers read whole, the usage on a wrong one), and one table in which every command
// has a function, in kvscope or in kvscope-app.

#include "qt_commands/app_commands.h"
#include "commands/commands.h"
#include "commands/option_parser.h"
#include "analysis/analyzer.h"
#include "format/bundle_reader.h"
#include "synth/synthetic_capture.h"

#include <QTemporaryDir>
#include <QTest>

#include <hdf5.h>
#include <nlohmann/json.hpp>

#include <fstream>
#include <iomanip>
#include <sstream>

using namespace kvscope::cli;

namespace {

// The demo's shape cut to 2 layers and one prompt of 24 + 6 positions, without a divergence.
kvscope::SyntheticCaptureOptions smallDemo()
{
    kvscope::SyntheticCaptureOptions o = kvscope::demoCaptureOptions();
    o.layers = 2;
    o.promptLens = {24};
    o.decodeTokens = 6;
    o.divergence = -1;
    return o;
}

}  // namespace

class TestCommandLine : public QObject {
    Q_OBJECT

private slots:
    void readsOperandsAndOptionsInAnyOrder();
    void repeatedOptionsCollectAndLaterValuesWin();
    void numbersAreReadWhole();
    void wrongCommandLinesSayWhatIsWrong_data();
    void wrongCommandLinesSayWhatIsWrong();
    void thresholdOptionsSetTheThresholds();
    void everyCommandHasAFunctionInOneExecutable();
    void analyzeSummarySpeaksTheAppsLanguage();
    void analyzeSummaryPrintsTheReferenceToolsBcWhenAsked();
    void analyzeSaysWhatItCouldNotReadOnItsErrorStream();
    void aFolderGivenByMistakeSaysSo();
    void progressOnlyOnATerminal();
    void whatifWritesItsJsonAndRefusesUnknownSchemes();
};

void TestCommandLine::readsOperandsAndOptionsInAnyOrder()
{
    std::string in, out, json;
    bool strict = false;
    int threads = 0;
    OptionParser parser("export");
    parser.operand("BUNDLE", in);
    parser.operand("OUT.h5", out);
    parser.text({"-o", "--json"}, json);
    parser.flag("--strict", strict);
    parser.integer("--threads", threads);
    std::ostringstream err;
    QVERIFY(parser.parse({"--threads", "3", "a.h5", "-o", "j.json", "--strict", "b.h5"}, err));
    QCOMPARE(in, std::string("a.h5"));
    QCOMPARE(out, std::string("b.h5"));
    QCOMPARE(json, std::string("j.json"));
    QVERIFY(strict);
    QCOMPARE(threads, 3);
    QVERIFY(err.str().empty());
}

void TestCommandLine::repeatedOptionsCollectAndLaterValuesWin()
{
    std::vector<std::string> prompts;
    int steps = 0;
    std::string dir = "default";
    OptionParser parser("demo");
    parser.repeated("--prompt", prompts);
    parser.integer("--fault-step", steps);
    parser.operand("DIR", dir, false);
    std::ostringstream err;
    QVERIFY(parser.parse({"--prompt", "p0", "--fault-step", "4", "--prompt", "p1", "--fault-step", "-3"}, err));
    QCOMPARE(prompts, (std::vector<std::string>{"p0", "p1"}));
    QCOMPARE(steps, -3);  // a negative value is a value, not an option
    QCOMPARE(dir, std::string("default"));  // optional operand left out: unchanged
}

void TestCommandLine::numbersAreReadWhole()
{
    double ratio = 0;
    std::optional<double> linf;
    std::uint64_t seed = 0;
    OptionParser parser("check");
    parser.real("--max-ratio", ratio);
    parser.real("--max-linf", linf);
    parser.integer("--seed", seed);
    std::ostringstream err;
    QVERIFY(parser.parse({"--max-ratio", "2.5", "--max-linf", "1e-3", "--seed", "18446744073709551615"}, err));
    QCOMPARE(ratio, 2.5);
    QVERIFY(linf);
    QCOMPARE(*linf, 1e-3);
    QCOMPARE(seed, std::uint64_t(18446744073709551615ull));
}

void TestCommandLine::wrongCommandLinesSayWhatIsWrong_data()
{
    QTest::addColumn<QStringList>("args");
    QTest::addColumn<QString>("message");
    QTest::newRow("no operand") << QStringList{} << "kvscope analyze: no BUNDLE given";
    QTest::newRow("unknown option") << QStringList{"a.h5", "--jsn", "x"} << "kvscope analyze: unknown option --jsn";
    QTest::newRow("missing value") << QStringList{"a.h5", "--json"} << "kvscope analyze: --json needs a value";
    QTest::newRow("an option for a value") << QStringList{"a.h5", "--json", "-o", "dir"}
                                           << "kvscope analyze: --json needs a value";
    QTest::newRow("trailing text") << QStringList{"a.h5", "--threads", "2x"}
                                   << "kvscope analyze: --threads takes a whole number, not '2x'";
    QTest::newRow("empty number") << QStringList{"a.h5", "--threads", ""}
                                  << "kvscope analyze: --threads takes a whole number, not ''";
    QTest::newRow("not a number") << QStringList{"a.h5", "--ratio", "nan"}
                                  << "kvscope analyze: --ratio takes a finite number, not 'nan'";
    QTest::newRow("too many operands") << QStringList{"a.h5", "b.h5"} << "kvscope analyze: unexpected argument 'b.h5'";
    QTest::newRow("required option left out") << QStringList{"a.h5", "--json", "j"} << "kvscope analyze: no -o DIR given";
}

void TestCommandLine::wrongCommandLinesSayWhatIsWrong()
{
    QFETCH(QStringList, args);
    QFETCH(QString, message);
    std::string bundle, json, dir;
    int threads = 0;
    OptionParser parser("analyze");
    parser.operand("BUNDLE", bundle);
    parser.text({"--json"}, json);
    parser.requiredText({"-o", "--output"}, "DIR", dir);
    double ratio = 0;
    parser.real("--ratio", ratio);
    parser.integer("--threads", threads);
    Args argv;
    for (const QString& a : args)
        argv.push_back(a.toStdString());
    std::ostringstream err;
    QVERIFY(!parser.parse(argv, err));
    const std::string text = err.str();
    QCOMPARE(QString::fromStdString(text.substr(0, text.find('\n'))), message);
    QVERIFY(text.find("usage: kvscope analyze BUNDLE") != std::string::npos);  // then the usage
}

void TestCommandLine::thresholdOptionsSetTheThresholds()
{
    kvscope::Thresholds t;
    OptionParser parser("check");
    addThresholdOptions(parser, t);
    std::ostringstream err;
    QVERIFY(parser.parse({"--min-bc", "0.8", "--seed-bc", "--max-ratio", "3", "--max-linf", "0.05", "--suspect-floor",
                          "7", "--suspect-drift-two-way", "9"},
                         err));
    QCOMPARE(t.minBc, 0.8);
    QVERIFY(!t.bcVsNoise);
    QCOMPARE(t.maxRatio, 3.0);
    QCOMPARE(t.maxLinf.value_or(-1), 0.05);
    QCOMPARE(t.suspects.offFloor, 7.0);
    QCOMPARE(t.suspects.twoWayDrift, 9.0);
}

void TestCommandLine::everyCommandHasAFunctionInOneExecutable()
{
    for (const Command& c : commands()) {
        const bool inKvscope = c.run != nullptr, inApp = appCommand(c.name) != nullptr;
        const bool inBench = std::string(c.executable) == "kvscope-bench";  // tools/bench/, not linked here
        QVERIFY2(int(inKvscope) + int(inApp) + int(inBench && !c.run) == 1, c.name);  // exactly one place runs it
        QVERIFY2(c.run || inApp || inBench, c.name);
        QCOMPARE(findCommand(c.name), &c);
    }
    QVERIFY(!appCommand("bench"));  // the benchmark is not part of the app
    QVERIFY(!appCommand("analyze"));  // the Qt-free commands are not kvscope-app's own
    QVERIFY(appCommand("report"));
}

void TestCommandLine::analyzeSummarySpeaksTheAppsLanguage()
{
    QTemporaryDir dir;
    kvscope::SyntheticCaptureOptions o = smallDemo();
    o.faultLayer = -1;
    auto summary = [&](const std::string& path) {
        kvscope::writeSyntheticCapture(path, o);
        std::ostringstream out, err;
        const int rc = analyze({path}, out, err);
        return std::make_pair(rc, out.str());
    };
    // 4 heads x 32 dims: 128 values a token, too few for a per-token BC to mean anything.
    const auto [rc, small] = summary(dir.filePath("small.h5").toStdString());
    QCOMPARE(rc, 0);
    QVERIFY2(small.find("no per-token BC: a token has 128 values (4 heads x 32)") != std::string::npos, small.c_str());
    QVERIFY(small.find("_bc_vs_noise ") == std::string::npos);
    // The worst cells name the noise floor as the app does, not "base".
    QVERIFY2(small.find(" floor ") != std::string::npos && small.find(" base ") == std::string::npos, small.c_str());
    QVERIFY2(small.find("every token pooled (K / V): against the noise floor:\n") != std::string::npos, small.c_str());
    // 8 heads x 128 dims: 1024 values, enough.
    o.kvHeads = 8;
    o.headDim = 128;
    const auto [rcLarge, large] = summary(dir.filePath("large.h5").toStdString());
    QCOMPARE(rcLarge, 0);
    QVERIFY2(large.find("min BC vs noise floor over tokens") != std::string::npos, large.c_str());
    QVERIFY(large.find("k_bc_vs_noise ") != std::string::npos && large.find("no per-token BC") == std::string::npos);
}

void TestCommandLine::analyzeSaysWhatItCouldNotReadOnItsErrorStream()
{
    // One byte of prompt_0's baseline K of layer 1 damaged: its checksum fails, the rest is
    // analysed (exit 0), the error stream names the dataset (with --json too), and the layer's
    // pooled BC says it leaves prompt_0 out.
    QTemporaryDir dir;
    const std::string path = dir.filePath("c.h5").toStdString();
    kvscope::SyntheticCaptureOptions o = smallDemo();
    o.promptLens = {24, 24};
    kvscope::writeSyntheticCapture(path, o);
    const char* damaged = "/prompts/prompt_0/reference/baseline/model.layers.1.self_attn/k";
    {
        const hid_t f = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
        const hid_t d = H5Dopen2(f, damaged, H5P_DEFAULT);
        QVERIFY(d >= 0);
        const hsize_t origin[4] = {0, 0, 0, 0};
        unsigned mask = 0;
        haddr_t address = HADDR_UNDEF;
        hsize_t size = 0;
        QVERIFY(H5Dget_chunk_info_by_coord(d, origin, &mask, &address, &size) >= 0 && address != HADDR_UNDEF);
        H5Dclose(d);
        H5Fclose(f);
        std::fstream file(path, std::ios::in | std::ios::out | std::ios::binary);
        file.seekg(std::streamoff(address + 2));
        const char byte = char(file.get() ^ 0x40);
        file.seekp(std::streamoff(address + 2));
        file.put(byte);
    }
    std::ostringstream out, err;
    QCOMPARE(analyze({path}, out, err), 0);
    QVERIFY2(err.str().find("kvscope analyze: 1 problem(s), the rest analysed") == 0, err.str().c_str());
    QVERIFY2(err.str().find(std::string(damaged) + ": chunk at row 0 does not match its Fletcher32 checksum") !=
                 std::string::npos, err.str().c_str());
    const std::string summary = out.str();
    const std::size_t aggregate = summary.find("\naggregate over 2 three-way prompt(s)");
    QVERIFY2(aggregate != std::string::npos, summary.c_str());
    const auto lineOf = [&](const std::string& layer) {
        const std::size_t at = summary.find("    " + layer + " ", aggregate);
        return at == std::string::npos ? std::string() : summary.substr(at, summary.find('\n', at) - at);
    };
    QVERIFY2(lineOf("model.layers.1.self_attn").find("(without prompt_0: not compared at this layer)") != std::string::npos,
             summary.c_str());
    QVERIFY2(!lineOf("model.layers.0.self_attn").empty() &&
                 lineOf("model.layers.0.self_attn").find("without") == std::string::npos, summary.c_str());

    std::ostringstream jsonOut, jsonErr;
    QCOMPARE(analyze({path, "--json", dir.filePath("c.json").toStdString()}, jsonOut, jsonErr), 0);
    QCOMPARE(jsonErr.str(), err.str());
}

void TestCommandLine::analyzeSummaryPrintsTheReferenceToolsBcWhenAsked()
{
    // The reference tool's combined BC costs a second pass over each layer and reads ~1 on real
    // faults: the summary prints it with --seed-bc only, and then the values the whole analysis
    // (as --json computes it) has.
    QTemporaryDir dir;
    const std::string path = dir.filePath("c.h5").toStdString();
    kvscope::writeSyntheticCapture(path, smallDemo());
    std::ostringstream plain, seed, err;
    QCOMPARE(analyze({path}, plain, err), 0);
    QCOMPARE(analyze({path, "--seed-bc"}, seed, err), 0);
    QVERIFY2(plain.str().find("reference tool's") == std::string::npos, plain.str().c_str());
    QVERIFY2(seed.str().find("against the noise floor, and the reference tool's:\n") != std::string::npos, seed.str().c_str());

    const kvscope::AnalysisResult all = kvscope::analyzeBundle(std::make_shared<kvscope::BundleReader>(path), {});
    QVERIFY(all.aggregate);
    const kvscope::AggregateBc& a = *all.aggregate;
    QCOMPARE(a.layers.size(), std::size_t(2));
    for (std::size_t l = 0; l < a.layers.size(); ++l) {
        const auto four = [](float v) {
            std::ostringstream s;
            s << std::setprecision(4) << v;
            return s.str();
        };
        QVERIFY(!std::isnan(a.combined[0][l]) && !std::isnan(a.combinedVsNoise[0][l]));
        const std::string vsNoise = four(a.combinedVsNoise[0][l]) + " / " + four(a.combinedVsNoise[1][l]);
        const std::string reference = "reference tool's " + four(a.combined[0][l]) + " / " + four(a.combined[1][l]);
        const std::string start = "    " + a.layers[l];
        // (after the aggregate's heading: the worst cells name the layers too)
        const std::size_t atPlain = plain.str().find(start + " ", plain.str().find("\naggregate over "));
        const std::size_t atSeed = seed.str().find(start + " ", seed.str().find("\naggregate over "));
        QVERIFY(atPlain != std::string::npos && atSeed != std::string::npos);
        const std::string linePlain = plain.str().substr(atPlain, plain.str().find('\n', atPlain) - atPlain);
        const std::string lineSeed = seed.str().substr(atSeed, seed.str().find('\n', atSeed) - atSeed);
        QVERIFY2(linePlain.size() >= vsNoise.size() && linePlain.substr(linePlain.size() - vsNoise.size()) == vsNoise, linePlain.c_str());
        QVERIFY2(lineSeed.find(vsNoise) != std::string::npos, lineSeed.c_str());
        QVERIFY2(lineSeed.size() >= reference.size() && lineSeed.substr(lineSeed.size() - reference.size()) == reference,
                 lineSeed.c_str());
    }
}

void TestCommandLine::progressOnlyOnATerminal()
{
    // analyze's progress goes to a terminal a person watches; a file or a pipe (here a string
    // stream, as a test or a script reads it) gets the results alone.
    QTemporaryDir dir;
    kvscope::SyntheticCaptureOptions o = kvscope::demoCaptureOptions();
    o.layers = 3;
    const std::string path = dir.filePath("p.h5").toStdString();
    kvscope::writeSyntheticCapture(path, o);
    std::ostringstream out, err;
    QCOMPARE(analyze({path}, out, err), 0);
    QCOMPARE(QString::fromStdString(err.str()), QString());
    QVERIFY(out.str().find("analysed") != std::string::npos);  // the heading, on the results' stream
    QVERIFY(out.str().find("of 3 layers") == std::string::npos);
}

void TestCommandLine::aFolderGivenByMistakeSaysSo()
{
    QTemporaryDir dir;
    const std::string folder = dir.path().toStdString();
    std::ostringstream out, err;
    QCOMPARE(importDumps({folder, "-o", folder + "/b.h5"}, out, err), 2);
    QVERIFY2(err.str().find(folder + ": is a folder, not a capture bundle") != std::string::npos, err.str().c_str());
    QVERIFY(err.str().find("kv_caches_rank<R>.pt") != std::string::npos);
    std::ostringstream out2, err2;
    QCOMPARE(analyze({folder}, out2, err2), 2);  // a folder is a sweep's bundles: none here
    QVERIFY2(err2.str().find(folder + ": is a folder without bundles (*.h5 files)") != std::string::npos, err2.str().c_str());
}

void TestCommandLine::whatifWritesItsJsonAndRefusesUnknownSchemes()
{
    QTemporaryDir dir;
    kvscope::SyntheticCaptureOptions o = smallDemo();
    o.faultLayer = -1;
    const std::string path = dir.filePath("w.h5").toStdString(), json = dir.filePath("w.json").toStdString();
    kvscope::writeSyntheticCapture(path, o);
    std::ostringstream out, err;
    QCOMPARE(whatif({path, "--schemes", "fp8_e4m3/tensor,int4/g16,nvfp4", "--json", json, "--maps"}, out, err), 0);
    std::ifstream file(json);
    const nlohmann::json j = nlohmann::json::parse(file);
    QCOMPARE(j.at("schemes").size(), std::size_t(3));
    QCOMPARE(j.at("schemes")[1].at("name").get<std::string>(), std::string("int4/g16"));
    QCOMPARE(j.at("schemes")[0].at("layers").size(), std::size_t(2));
    const nlohmann::json& layer = j.at("schemes")[0].at("layers")[0];
    for (const char* field : {"k_rel_l2_median", "v_rel_l2_median", "k_floor_ratio_median", "v_floor_ratio_median",
                              "k_saturated", "k_outlier_channel", "hurt", "worst_cells"})
        QVERIFY2(layer.contains(field), field);
    // e4m3 per tensor on random KV: about e4m3's 2.7% relative error.
    const double k = layer.at("k_rel_l2_median").get<double>();
    QVERIFY2(k > 0.02 && k < 0.035, qPrintable(QString::number(k)));
    QCOMPARE(j.at("schemes")[0].at("maps")[0].at("k").size(), std::size_t(2 * 30));
    std::ostringstream out2, err2;
    QCOMPARE(whatif({path, "--schemes", "fp7/tensor"}, out2, err2), 2);
    QVERIFY2(err2.str().find("unknown scheme 'fp7/tensor'") != std::string::npos, err2.str().c_str());
    std::ostringstream out3, err3;
    QCOMPARE(whatif({path}, out3, err3), 0);
    QVERIFY2(out3.str().find("fp8_e4m3/tensor: fp8 e4m3 per tensor: within") != std::string::npos, out3.str().c_str());
}

QTEST_APPLESS_MAIN(TestCommandLine)
#include "tst_command_line.moc"
