// A sweep (kv/sweep.h): several bundles analysed as one. Its prompts are named by bundle and
// id, pooled exactly as if one bundle held them all, read each from its own bundle (prefix
// caching shares nothing across bundles); a bundle that cannot be read, or whose config is
// another model's, is left out with the file named; folders give their bundles in name order.

#include "analysis/analysis_json.h"
#include "analysis/analyzer.h"
#include "format/bundle_error.h"
#include "format/bundle_reader.h"
#include "kv/sweep.h"
#include "sharing_capture.h"
#include "small_model.h"
#include "kv/block_sharing.h"
#include "synth/model_capture.h"
#include "synth/synthetic_capture.h"

#include <QTemporaryDir>
#include <QTest>

#include <filesystem>
#include <fstream>
#include <sstream>

using namespace kvscope;
using namespace kvscope::synth;

class TestSweep : public QObject {
    Q_OBJECT

private slots:
    void foldersGiveTheirBundlesInOrder();
    void poolsAsOneBundleWould();
    void leavesOutWhatCannotBeRead();
    void sharesNoBlocksAcrossBundles();

private:
    std::string path(const std::string& name) const { return (m_dir.path() + "/").toStdString() + name; }
    QTemporaryDir m_dir;
};

namespace {

std::string json(const AnalysisResult& result)
{
    std::ostringstream out;
    writeAnalysisJson(result, out);
    return out.str();
}

void copy(const std::string& from, const std::string& to)
{
    std::filesystem::create_directories(std::filesystem::path(to).parent_path());
    std::filesystem::copy_file(from, to, std::filesystem::copy_options::overwrite_existing);
}

}  // namespace

void TestSweep::foldersGiveTheirBundlesInOrder()
{
    const std::string folder = path("order");
    std::filesystem::create_directories(folder + "/sub");
    for (const char* name : {"/b.h5", "/a.h5", "/notes.txt", "/sub/c.h5"})
        std::ofstream(folder + name) << "x";
    QCOMPARE(sweepBundlePaths({folder}), (std::vector<std::string>{folder + "/a.h5", folder + "/b.h5"}));
    QCOMPARE(sweepBundlePaths({folder + "/b.h5", folder + "/sub"}),
             (std::vector<std::string>{folder + "/b.h5", folder + "/sub/c.h5"}));
    QVERIFY(isSweep({folder}));
    QVERIFY(isSweep({folder + "/a.h5", folder + "/b.h5"}));
    QVERIFY(!isSweep({folder + "/a.h5"}));
    std::filesystem::create_directories(path("empty"));
    try {
        sweepBundlePaths({path("empty")});
        QFAIL("a folder without bundles was taken");
    } catch (const BundleError& e) {
        QVERIFY(std::string(e.what()).find(path("empty")) != std::string::npos);
    }
    QVERIFY_THROWS_EXCEPTION(BundleError, sweepBundlePaths({path("missing.h5")}));
}

void TestSweep::poolsAsOneBundleWould()
{
    // One bundle of two prompts, and a sweep of two copies of it taking the first prompt of one
    // and the second of the other: the same prompts, so the same pooled BCs, cells and suspects.
    ModelCaptureOptions o = kvtest::smallModel(FaultKind::RopeOffset);
    const std::string both = path("both.h5");
    writeModelCapture(both, o);
    copy(both, path("pool/a.h5"));
    copy(both, path("pool/b.h5"));
    AnalysisResult alone = analyzeBundle(std::make_shared<BundleReader>(both));
    const Sweep sweep = openSweep({path("pool")}, UnreadableBlockPolicy::MarkAbsent, nullptr);
    QCOMPARE(sweep.label, path("pool"));
    QCOMPARE(sweep.bundles.size(), std::size_t(2));
    QCOMPARE(sweep.loader->prompts().size(), std::size_t(4));
    QCOMPARE(sweep.loader->prompts()[3].id, std::string("b/prompt_1"));
    AnalysisOptions options;
    options.prompts = {"a/prompt_0", "b/prompt_1"};
    AnalysisResult swept = analyzeSweep(sweep, options);
    QCOMPARE(swept.bundle, path("pool"));
    QCOMPARE(swept.prompts.size(), std::size_t(2));
    QCOMPARE(swept.prompts[1].id, std::string("b/prompt_1"));
    QVERIFY(!swept.suspects.empty());
    QVERIFY(swept.aggregate.has_value());
    QCOMPARE(swept.aggregate->promptIds, (std::vector<std::string>{"a/prompt_0", "b/prompt_1"}));
    // Named as one bundle names them, the two analyses write the same JSON.
    const auto rename = [](std::string text) {
        for (const auto& [from, to] : {std::pair<std::string, std::string>{"a/prompt_0", "prompt_0"}, {"b/prompt_1", "prompt_1"}})
            for (std::size_t at = text.find(from); at != std::string::npos; at = text.find(from, at))
                text.replace(at, from.size(), to);
        return text;
    };
    swept.bundle = alone.bundle;
    swept.bundles.clear();
    const std::string expected = json(alone), got = rename(json(swept));
    QCOMPARE(got.size(), expected.size());
    QVERIFY(got == expected);
}

void TestSweep::leavesOutWhatCannotBeRead()
{
    ModelCaptureOptions o = kvtest::smallModel();
    std::filesystem::create_directories(path("mixed"));
    writeModelCapture(path("mixed/good.h5"), o);
    std::ofstream(path("mixed/broken.h5")) << "not a bundle";
    ModelCaptureOptions other = o;
    other.shape.kvHeads = 2;  // another model
    writeModelCapture(path("mixed/other.h5"), other);
    const Sweep sweep = openSweep({path("mixed")}, UnreadableBlockPolicy::MarkAbsent, nullptr);
    QCOMPARE(sweep.bundles.size(), std::size_t(3));
    QCOMPARE(sweep.bundles[0].name, std::string("broken"));
    QVERIFY(sweep.bundles[0].problem.find(path("mixed/broken.h5")) != std::string::npos);
    QVERIFY(sweep.bundles[1].problem.empty());
    QVERIFY(sweep.bundles[2].problem.find(path("mixed/other.h5")) != std::string::npos);
    QVERIFY(sweep.bundles[2].problem.find("kv_cache_config") != std::string::npos);
    std::filesystem::remove(path("mixed/broken2.h5"));
    const AnalysisResult result = analyzeSweep(sweep);
    QCOMPARE(result.prompts.size(), std::size_t(2));
    QCOMPARE(result.prompts[0].id, std::string("good/prompt_0"));
    const std::string text = json(result);
    QVERIFY(text.find("\"name\":\"broken\",\"path\":\"" + path("mixed/broken.h5") + "\",\"analysed\":false") != std::string::npos);
    QVERIFY(text.find("\"name\":\"good\",\"path\":\"" + path("mixed/good.h5") + "\",\"analysed\":true,\"problem\":null") !=
            std::string::npos);
    QVERIFY_THROWS_EXCEPTION(BundleError, requireEveryBundle(sweep));
    // Nothing readable: said, with every file's problem.
    std::ofstream(path("mixed/broken2.h5")) << "not a bundle either";
    const Sweep none = openSweep({path("mixed/broken.h5"), path("mixed/broken2.h5")}, UnreadableBlockPolicy::MarkAbsent, nullptr);
    QVERIFY(!none.loader);
    QVERIFY_THROWS_EXCEPTION(BundleError, analyzeSweep(none));
    // Two bundles of one name in different folders are named by their paths.
    const Sweep twins = openSweep({path("mixed/good.h5"), path("pool/a.h5"), path("both.h5")}, UnreadableBlockPolicy::MarkAbsent, nullptr);
    QCOMPARE(twins.bundles[0].name, std::string("good"));
    QCOMPARE(twins.bundles[1].name, std::string("a"));
    // (a config mismatch against the first readable bundle)
    QCOMPARE(sweepConfigMismatch(sweep.loader->config(), sweep.loader->config()), std::string());
}

void TestSweep::sharesNoBlocksAcrossBundles()
{
    // A capture whose later two prompts start with the first's two blocks of 16, twice: the
    // copies hold the same block ids for the same tokens, yet two engines share nothing.
    std::filesystem::create_directories(path("prefix"));
    writeSyntheticCapture(path("prefix/x.h5"), kvtest::sharedPrefixCapture());
    copy(path("prefix/x.h5"), path("prefix/y.h5"));
    const Sweep sweep = openSweep({path("prefix")}, UnreadableBlockPolicy::MarkAbsent, nullptr);
    std::vector<std::string> ids;
    for (const PromptInfo& p : sweep.loader->prompts())
        ids.push_back(p.id);
    QCOMPARE(ids.size(), std::size_t(6));
    const BlockSharing sharing(*sweep.loader, ids);
    const std::vector<char> all(6, 1);
    QCOMPARE(sharing.sharedAt(4, 0, 0).prompts, (std::vector<std::string>{"y/prompt_0", "y/prompt_1", "y/prompt_2"}));
    QCOMPARE(sharing.sharedAt(1, 0, 31).prompts, (std::vector<std::string>{"x/prompt_0", "x/prompt_1", "x/prompt_2"}));
    QVERIFY(!sharing.heldEarlier(3, 0, 0, all));  // y's first prompt pools its blocks: x's are another engine's
    QVERIFY(sharing.heldEarlier(4, 0, 0, all));
}

QTEST_GUILESS_MAIN(TestSweep)
#include "tst_sweep.moc"
