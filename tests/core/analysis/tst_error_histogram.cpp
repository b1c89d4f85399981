// The drill-down's per-head error histograms against errors binned here.

#include "analysis/head_error_histogram.h"
#include "metric_reference.h"
#include "synth/synthetic_capture.h"
#include "test_support.h"

#include <QTemporaryDir>
#include <QTest>

using namespace kvscope;
using namespace kvtest;

class TestErrorHistogram : public QObject {
    Q_OBJECT

private slots:
    void initTestCase();
    void headHistogram();
    void longRangesReadInWindows();
    void displayBins();

private:
    QTemporaryDir m_dir;
    std::string m_demo;
};

void TestErrorHistogram::initTestCase()
{
    m_demo = m_dir.filePath("demo.h5").toStdString();
    writeSmallCapture(m_demo);
}

namespace {

// The histogram of tokens [begin, end) against the errors of the whole layers, binned here;
// the tokens it used.
std::int64_t checkAgainstWholeLayers(const CaptureLoader& loader, const std::string& prompt, const std::string& layer,
                                     int head, KvPart part, std::int64_t begin, std::int64_t end)
{
    const HeadErrorHistogram h = headErrorHistogram(loader, prompt, layer, head, part, begin, end);
    const LayerKv base = loader.referenceLayer(prompt, ReferenceRole::Baseline, layer);
    const LayerKv expected = loader.referenceLayer(prompt, ReferenceRole::Expected, layer);
    const LayerKv actual = loader.engineLayer(prompt, layer);
    std::vector<double> eb, et;
    std::int64_t used = 0;
    for (std::int64_t t = begin; t < end; ++t) {
        if (!actual.present[std::size_t(t)] || !base.present[std::size_t(t)] || !expected.present[std::size_t(t)])
            continue;
        ++used;
        const auto b = errors(base, expected, t, part, head), a = errors(base, actual, t, part, head);
        eb.insert(eb.end(), b.begin(), b.end());
        et.insert(et.end(), a.begin(), a.end());
    }
    [&] {
        QCOMPARE(h.tokensUsed, used);
        QCOMPARE(h.base->total(), std::uint64_t(eb.size()));
        QCOMPARE(h.actual.total(), std::uint64_t(et.size()));
        QVERIFY(std::abs(h.bc - referenceBc(eb, et)) < 1e-6);
        QCOMPARE(h.hi, std::max(*std::max_element(eb.begin(), eb.end()), *std::max_element(et.begin(), et.end())));
    }();
    return used;
}

}  // namespace

void TestErrorHistogram::headHistogram()
{
    const CaptureLoader loader(std::make_shared<BundleReader>(m_demo));
    const std::string layer = "model.layers.3.self_attn";
    QVERIFY(checkAgainstWholeLayers(loader, "prompt_1", layer, 1, KvPart::K, 20, 40) > 0);
    QVERIFY_THROWS_EXCEPTION(std::invalid_argument, headErrorHistogram(loader, "prompt_1", layer, 9, KvPart::K, 0, 5));
    QVERIFY_THROWS_EXCEPTION(std::invalid_argument, headErrorHistogram(loader, "prompt_1", layer, 0, KvPart::K, 5, 500));
}

void TestErrorHistogram::longRangesReadInWindows()
{
    // A range of 9,000 tokens (read 4,096 at a time, blocks scattered, references chunked along
    // their positions): the same errors as the whole layers give, in the same order.
    SyntheticCaptureOptions o;
    o.layers = 2;
    o.alternateSliding = false;
    o.kvHeads = 2;
    o.headDim = 16;
    o.promptLens = {9000};
    o.decodeTokens = 8;
    o.faultLayer = -1;
    o.divergence = -1;
    o.poolFactor = 3;
    const std::string path = m_dir.filePath("long.h5").toStdString();
    writeSyntheticCapture(path, o);
    const CaptureLoader loader(std::make_shared<BundleReader>(path));
    QVERIFY(checkAgainstWholeLayers(loader, "prompt_0", "model.layers.1.self_attn", 1, KvPart::V, 7, 9007) > 8990);
}

void TestErrorHistogram::displayBins()
{
    // Log: 3 bins from the smallest positive error (0.002) to the largest (2), a factor 10
    // each: [0.002, 0.02), [0.02, 0.2), [0.2, 2]; the exact zero is counted apart.
    const DisplayBins log = logDisplayBins({0.0f, 0.005f, 0.05f}, {0.002f, 0.5f, 2.0f}, 3);
    QCOMPARE(log.edges.size(), std::size_t(4));
    QVERIFY(std::abs(log.edges[1] - 0.02) < 1e-9 && std::abs(log.edges[2] - 0.2) < 1e-8);
    QCOMPARE(log.edges.front(), double(0.002f));
    QCOMPARE(log.edges.back(), 2.0);
    QCOMPARE(log.base, (std::vector<double>{1, 1, 0}));
    QCOMPARE(log.actual, (std::vector<double>{1, 0, 2}));
    QCOMPARE(log.baseApart, std::int64_t(1));
    QCOMPARE(log.actualApart, std::int64_t(0));
    // Linear: 100 errors 0.00, 0.01, ..., 0.99 and one huge one. The 99th percentile of the
    // 101 (rank 99 of 0..100) is 0.99: bins of 0.99 / 3 = 0.33 and the huge one overflows.
    std::vector<float> base;
    for (int i = 0; i < 100; ++i)
        base.push_back(float(i) / 100);
    const DisplayBins linear = linearDisplayBins(base, {1000.0f}, 3);
    QCOMPARE(linear.edges.front(), 0.0);
    QCOMPARE(linear.edges.back(), double(0.99f));
    // [0, .33): 0.00..0.32; [.33, .66): 0.33..0.65; [.66, .99]: 0.66..0.99 (last bin closed).
    QCOMPARE(linear.base, (std::vector<double>{33, 33, 34}));
    QCOMPARE(linear.actual, (std::vector<double>{0, 0, 0}));
    QCOMPARE(linear.actualApart, std::int64_t(1));
    QCOMPARE(linear.baseApart, std::int64_t(0));
    // Nothing positive: no log bins; all zero: one linear range that holds them.
    QVERIFY(logDisplayBins({0.0f}, {0.0f}).edges.empty());
    QCOMPARE(linearDisplayBins({0.0f}, {0.0f}, 2).base, (std::vector<double>{1, 0}));
}

QTEST_APPLESS_MAIN(TestErrorHistogram)
#include "tst_error_histogram.moc"
