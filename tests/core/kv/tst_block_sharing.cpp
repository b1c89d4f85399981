// Prefix caching: prompts that share physical blocks for a common prefix. The sharing is found
// (same block, same tokens up to its end), the pooled statistics count a shared block's tokens
// once (checked against the BCs of the raw errors pooled by hand, which differ when they are
// counted twice), and a suspect whose onset lies in a shared block names the prompts sharing it.

#include "analysis/analyzer.h"
#include "kv/block_sharing.h"
#include "kv/capture_loader.h"
#include "metric_reference.h"
#include "sharing_capture.h"
#include "synth/synthetic_capture.h"

#include <QTemporaryDir>
#include <QTest>

using namespace kvscope;
using namespace kvtest;

class TestBlockSharing : public QObject {
    Q_OBJECT
private slots:
    void sharedBlocksAreFound();
    void pooledStatisticsCountSharedTokensOnce();
    void suspectInSharedBlockNamesItsPrompts();

private:
    std::shared_ptr<BundleReader> write(const SyntheticCaptureOptions& o, const QString& name)
    {
        const std::string path = m_dir.filePath(name).toStdString();
        writeSyntheticCapture(path, o);
        return std::make_shared<BundleReader>(path);
    }
    QTemporaryDir m_dir;
};

void TestBlockSharing::sharedBlocksAreFound()
{
    const auto reader = write(sharedPrefixCapture(), "shared.h5");
    const CaptureLoader loader(reader);
    const BlockSharing sharing(loader, {"prompt_0", "prompt_1", "prompt_2"});
    QVERIFY(sharing.any());
    const std::vector<char> all{1, 1, 1};
    for (std::int64_t pos : {0, 15, 16, 31}) {
        const BlockSharing::Sharing s = sharing.sharedAt(1, 0, pos);
        QCOMPARE(s.prompts, (std::vector<std::string>{"prompt_0", "prompt_1", "prompt_2"}));
        QCOMPARE(s.physical, std::int64_t(loader.blockTable("prompt_0", 0, 0).at(0, pos / 16)));
        QVERIFY(!sharing.heldEarlier(0, 0, pos, all));  // the first prompt pools it
        QVERIFY(sharing.heldEarlier(1, 0, pos, all));
        QVERIFY(!sharing.heldEarlier(1, 0, pos, {0, 1, 1}));  // unless prompt 0 is not pooled
    }
    for (std::int64_t pos : {32, 39, 47})  // the prompts' own tokens
        QVERIFY(sharing.sharedAt(1, 0, pos).prompts.empty());

    // Without a common prefix, no block is shared, whatever ids the tables hold.
    SyntheticCaptureOptions apart = sharedPrefixCapture();
    apart.sharedPrefixBlocks = 0;
    const CaptureLoader other(write(apart, "apart.h5"));
    QVERIFY(!BlockSharing(other, {"prompt_0", "prompt_1", "prompt_2"}).any());
}

void TestBlockSharing::pooledStatisticsCountSharedTokensOnce()
{
    const auto reader = write(sharedPrefixCapture(), "pooled.h5");
    const AnalysisResult result = analyzeBundle(reader);
    QVERIFY(result.aggregate);
    const AggregateBc& agg = *result.aggregate;
    const CaptureLoader loader(reader);
    bool twiceDiffers = false;
    for (std::size_t l = 0; l < agg.layers.size(); ++l)
        for (KvPart part : {KvPart::K, KvPart::V}) {
            std::vector<double> once[2], twice[2];  // [base, actual]
            for (std::size_t i = 0; i < result.prompts.size(); ++i) {
                const std::string& id = result.prompts[i].id;
                const LayerKv base = loader.referenceLayer(id, ReferenceRole::Baseline, agg.layers[l]);
                const LayerKv expected = loader.referenceLayer(id, ReferenceRole::Expected, agg.layers[l]);
                const LayerKv actual = loader.engineLayer(id, agg.layers[l]);
                for (std::int64_t t = 0; t < base.seq; ++t) {
                    if (!actual.present[std::size_t(t)])
                        continue;
                    const auto eb = errors(base, expected, t, part), et = errors(base, actual, t, part);
                    twice[0].insert(twice[0].end(), eb.begin(), eb.end());
                    twice[1].insert(twice[1].end(), et.begin(), et.end());
                    if (i > 0 && t < 32)
                        continue;  // prompt 0's blocks: counted with prompt 0
                    once[0].insert(once[0].end(), eb.begin(), eb.end());
                    once[1].insert(once[1].end(), et.begin(), et.end());
                }
            }
            const float got = agg.combined[std::size_t(part)][l];
            QVERIFY2(std::abs(got - referenceBc(once[0], once[1])) < 1e-6,
                     qPrintable(QString("layer %1: %2 vs %3").arg(l).arg(got).arg(referenceBc(once[0], once[1]))));
            const float noise = agg.combinedVsNoise[std::size_t(part)][l];
            QVERIFY(std::abs(noise - referenceBcVsNoise(once[0], once[1])) < 1e-6);
            twiceDiffers = twiceDiffers || std::abs(got - referenceBc(twice[0], twice[1])) > 1e-6 ||
                           std::abs(noise - referenceBcVsNoise(twice[0], twice[1])) > 1e-6;
        }
    QVERIFY2(twiceDiffers, "counting the shared tokens twice gives the same BCs: the test shows nothing");
}

void TestBlockSharing::suspectInSharedBlockNamesItsPrompts()
{
    SyntheticCaptureOptions o = sharedPrefixCapture();
    o.faultLayer = 1;
    o.faultPosition = -30;  // from prompt 0's position 10, in its first block, which the others share
    const AnalysisResult result = analyzeBundle(write(o, "fault.h5"));
    QVERIFY(!result.suspects.empty());
    const Suspect& s = result.suspects.front();
    QCOMPARE(s.firstToken, std::int64_t(10));
    QCOMPARE(s.sharedBy, (std::vector<std::string>{"prompt_0", "prompt_1", "prompt_2"}));
    QVERIFY(s.sharedBlock >= 0);
    QVERIFY2(s.evidence.find("which prompts prompt_0, prompt_1, prompt_2 share (prefix caching)") != std::string::npos,
             s.evidence.c_str());
}

QTEST_APPLESS_MAIN(TestBlockSharing)
#include "tst_block_sharing.moc"
