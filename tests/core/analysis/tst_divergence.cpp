// Divergences derived from logits, with the bf16 ULP bound.

#include "analysis/divergence.h"
#include "format/bundle_writer.h"
#include "metric_reference.h"
#include "test_support.h"

#include <QTemporaryDir>
#include <QTest>

using namespace kvscope;
using namespace kvtest;

class TestDivergence : public QObject {
    Q_OBJECT

private slots:
    void divergencesFromLogits();

private:
    QTemporaryDir m_dir;
};

void TestDivergence::divergencesFromLogits()
{
    // ULP bound, hand-worked: |v| = 10 -> 2^(3 - 7) = 0.0625; |v| = 0.75 -> 2^(-1 - 7).
    QCOMPARE(ulpBound(10.0), 0.0625);
    QCOMPARE(ulpBound(-0.75), std::ldexp(1.0, -8));

    const QString path = m_dir.filePath("logits.h5");
    const KvCacheConfig cfg = KvCacheConfig::fromJson(kvtest::configJson(8, 1, 1, 2, {{{"l0"}, "FullAttentionSpec", 4}}));
    {
        BundleWriter w(path.toStdString(), {}, cfg);
        w.addPrompt({"p", {1, 2, 3}, {4, 1, 2, 0, 3}, std::nullopt, {}});
        EngineSnapshot s;
        s.seqLens = {8};
        s.blockTables = {kvtest::table({{1, 2}}, 2)};
        s.ranks = {{{"l0", {RawTensor::fromFloat(DType::Float32, {8, 1, 4, 2}, std::vector<float>(64, 1.0f)),
                            RawTensor::fromFloat(DType::Float32, {8, 1, 4, 2}, std::vector<float>(64, 1.0f))}}}};
        w.addSnapshot("p", s);
        const RawTensor ref = RawTensor::fromFloat(DType::Float32, {1, 1, 8, 2}, std::vector<float>(16, 1.0f));
        w.addReference("p", ReferenceRole::Expected, "l0", ref, ref);
        // vocab 5; teacher tokens 4, 1, 2, 0, 3. Step 1: engine prefers 3 by 0.05 at |v| = 10
        // (within 0.0625); step 3: prefers 4 by 1.0 (beyond).
        Logits actual{5, 5, std::vector<float>(25, 0.0f)};
        auto row = [&](int g) { return actual.values.data() + g * 5; };
        row(0)[4] = 10;
        row(1)[1] = 9.95f, row(1)[3] = 10;
        row(2)[2] = 10;
        row(3)[0] = 9, row(3)[4] = 10;
        row(4)[3] = 10;
        w.addLogits("p", LogitsRole::Actual, actual);
        w.finish();
    }
    const CaptureLoader loader(std::make_shared<BundleReader>(path.toStdString()));
    const std::vector<Divergence> d = findDivergences(loader, loader.prompt("p"));
    QCOMPARE(d.size(), std::size_t(2));
    QCOMPARE(d[0].position, std::int64_t(3 + 1));
    QVERIFY(d[0].derived);
    QCOMPARE(*d[0].engineToken, std::int64_t(3));
    QCOMPARE(*d[0].teacherToken, std::int64_t(1));
    QVERIFY(std::abs(*d[0].logitGap - (10.0 - double(9.95f))) < 1e-12);
    QCOMPARE(*d[0].ulpBound, 0.0625);
    QVERIFY(*d[0].inBounds);
    QCOMPARE(d[1].position, std::int64_t(3 + 3));
    QVERIFY(!*d[1].inBounds);
}

QTEST_APPLESS_MAIN(TestDivergence)
#include "tst_divergence.moc"
