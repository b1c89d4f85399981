// The drill-down's per-head error histograms against errors binned here.

#include "kv/capture_loader.h"
#include "metrics/error_histogram.h"
#include "metric_reference.h"
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

private:
    QTemporaryDir m_dir;
    std::string m_demo;
};

void TestErrorHistogram::initTestCase()
{
    m_demo = m_dir.filePath("demo.h5").toStdString();
    writeSmallCapture(m_demo);
}

void TestErrorHistogram::headHistogram()
{
    const CaptureLoader loader(std::make_shared<BundleReader>(m_demo));
    const std::string layer = "model.layers.3.self_attn";
    const HeadErrorHistogram h = headErrorHistogram(loader, "prompt_1", layer, 1, KvPart::K, 20, 40);
    const LayerKv base = loader.referenceLayer("prompt_1", ReferenceRole::Baseline, layer);
    const LayerKv expected = loader.referenceLayer("prompt_1", ReferenceRole::Expected, layer);
    const LayerKv actual = loader.engineLayer("prompt_1", layer);
    std::vector<double> eb, et;
    std::int64_t used = 0;
    for (std::int64_t t = 20; t < 40; ++t) {
        if (!actual.present[std::size_t(t)])
            continue;
        ++used;
        const auto b = errors(base, expected, t, KvPart::K, 1), a = errors(base, actual, t, KvPart::K, 1);
        eb.insert(eb.end(), b.begin(), b.end());
        et.insert(et.end(), a.begin(), a.end());
    }
    QCOMPARE(h.tokensUsed, used);
    QCOMPARE(h.base->total(), std::uint64_t(eb.size()));
    QCOMPARE(h.actual.total(), std::uint64_t(et.size()));
    QVERIFY(std::abs(h.bc - referenceBc(eb, et)) < 1e-6);
    QCOMPARE(h.hi, std::max(*std::max_element(eb.begin(), eb.end()), *std::max_element(et.begin(), et.end())));
    QVERIFY_THROWS_EXCEPTION(std::invalid_argument, headErrorHistogram(loader, "prompt_1", layer, 9, KvPart::K, 0, 5));
    QVERIFY_THROWS_EXCEPTION(std::invalid_argument, headErrorHistogram(loader, "prompt_1", layer, 0, KvPart::K, 5, 500));
}

QTEST_APPLESS_MAIN(TestErrorHistogram)
#include "tst_error_histogram.moc"
