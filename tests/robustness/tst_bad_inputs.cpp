// The corpus of broken inputs (tests/data/bad/make_bad_bundles.py, one file per kind, made
// fresh by the `bad_inputs_corpus` fixture): each goes through everything the app does with a
// bundle, in this process (no crash guard to hide a crash), and must end as its manifest
// says: a clear error naming the file, the object and the problem; or an analysis that marks
// the damaged part; never a crash, never a silent number, never a large allocation.

#include "analysis/analyzer.h"
#include "format/bundle_error.h"
#include "format/bundle_reader.h"

#include <nlohmann/json.hpp>

#include <QTest>

#include <cmath>
#include <cstring>
#include <fstream>
#include <sys/resource.h>

using namespace kvscope;

namespace {

struct Outcome {
    bool opened = false;
    std::vector<std::string> messages;
    std::optional<AnalysisResult> result;
};

// Open, validate (what `kvscope inspect` shows), analyse (lenient, as the app does).
Outcome useBundle(const std::string& path)
{
    Outcome out;
    try {
        auto reader = std::make_shared<BundleReader>(path);
        out.opened = true;
        out.messages = reader->validate();
        for (const PromptInfo& p : reader->prompts())
            out.messages.insert(out.messages.end(), p.problems.begin(), p.problems.end());
        AnalysisOptions options;
        options.threads = 2;
        out.result = analyzeBundle(reader, options);
        out.messages.insert(out.messages.end(), out.result->problems.begin(), out.result->problems.end());
        for (const PromptAnalysis& p : out.result->prompts)
            out.messages.insert(out.messages.end(), p.problems.begin(), p.problems.end());
    } catch (const BundleError& e) {
        out.messages.push_back(e.what());
    }
    return out;
}

long peakRssKb()
{
    rusage usage{};
    getrusage(RUSAGE_SELF, &usage);
    return usage.ru_maxrss;
}

bool sameBits(const SpillableArray& a, const SpillableArray& b)
{
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

}  // namespace

class TestBadInputs : public QObject {
    Q_OBJECT

private slots:
    void corpus_data();
    void corpus();
};

void TestBadInputs::corpus_data()
{
    QTest::addColumn<QString>("file");
    QTest::addColumn<QString>("expect");
    QTest::addColumn<QString>("object");
    QTest::addColumn<QString>("problem");
    QTest::addColumn<QString>("base");
    std::ifstream in(KVSCOPE_BAD_INPUTS);
    QVERIFY2(in, "no manifest: run the bad_inputs_corpus test (ctest fixture) first");
    const nlohmann::json manifest = nlohmann::json::parse(in);
    QVERIFY(manifest.size() >= 30);
    for (const auto& entry : manifest)
        QTest::newRow(entry["kind"].get<std::string>().c_str())
            << QString::fromStdString(entry["file"]) << QString::fromStdString(entry["expect"])
            << QString::fromStdString(entry["object"]) << QString::fromStdString(entry["problem"])
            << QString::fromStdString(entry.value("base", ""));
}

void TestBadInputs::corpus()
{
    QFETCH(QString, file);
    QFETCH(QString, expect);
    QFETCH(QString, object);
    QFETCH(QString, problem);
    QFETCH(QString, base);
    const long rssBefore = peakRssKb();
    const Outcome out = useBundle(file.toStdString());
    // Declared sizes are not trusted: nothing near what a damaged header claims is allocated.
    QVERIFY2(peakRssKb() - rssBefore < 256 * 1024, "reading it allocated more than 256 MB");

    const auto says = [&](const std::string& m) {
        return m.find(file.toStdString()) != std::string::npos && m.find(object.toStdString()) != std::string::npos &&
               m.find(problem.toStdString()) != std::string::npos;
    };
    std::string all;
    for (const std::string& m : out.messages)
        all += "\n  " + m;
    const bool named = std::any_of(out.messages.begin(), out.messages.end(), says);

    if (expect == "error" || expect == "any") {
        QVERIFY2(named, qPrintable("no message names the file, '" + object + "' and '" + problem + "':" +
                                   QString::fromStdString(all)));
    } else if (expect == "partial") {
        QVERIFY2(out.result, qPrintable("expected an analysis with the damage marked; got:" + QString::fromStdString(all)));
        QVERIFY2(named, qPrintable("the analysis does not name '" + object + "' and '" + problem + "':" +
                                   QString::fromStdString(all)));
    } else if (expect == "non_finite") {
        QVERIFY(out.result && !out.result->prompts.empty());
        const PromptAnalysis& p = out.result->prompts.front();
        QVERIFY2(!p.nonFinite.empty(), "NaN/Inf values were not reported");
        for (const NonFiniteCell& c : p.nonFinite) {
            QCOMPARE(QString::fromStdString(p.layers[std::size_t(c.layer)]), object);
            // Shown as "no data", never as a number computed from NaN or Inf.
            QVERIFY(std::isnan(p.value(metricFor(c.part, MetricKind::Linf), c.layer, c.token, c.head)) ||
                    c.side != "actual");
            QVERIFY(!p.threeWay || std::isnan(p.value(baseOf(metricFor(c.part, MetricKind::Linf)), c.layer, c.token, c.head)) ||
                    c.side != "expected");
            // No BC from errors that hold NaN or Inf.
            QVERIFY(!p.threeWay || std::isnan(p.bcValue(c.part, c.layer, c.token)));
            QVERIFY(!p.threeWay || std::isnan(p.bcVsNoiseValue(c.part, c.layer, c.token)));
        }
    } else if (expect == "same_as_base") {
        QVERIFY2(out.result && out.messages.empty(), qPrintable("problems:" + QString::fromStdString(all)));
        const Outcome reference = useBundle(base.toStdString());
        QVERIFY(reference.result && reference.messages.empty());
        const PromptAnalysis& a = out.result->prompts.at(0);
        const PromptAnalysis& b = reference.result->prompts.at(0);
        for (int m = 0; m < kMetricCount; ++m)
            QVERIFY2(sameBits(a.metrics[std::size_t(m)], b.metrics[std::size_t(m)]), metricName(Metric(m)));
        QVERIFY(sameBits(a.bc[0], b.bc[0]) && sameBits(a.bc[1], b.bc[1]));
    } else {
        QFAIL(qPrintable("unknown expectation " + expect));
    }
}

QTEST_GUILESS_MAIN(TestBadInputs)
#include "tst_bad_inputs.moc"
