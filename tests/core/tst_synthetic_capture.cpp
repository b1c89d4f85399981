// The model-free synthetic capture end to end: written with a vLLM-like paged layout (shuffled pool,
// freed and reused sliding-window blocks, TP shards, two snapshots around a divergence),
// read back, reconstructed and compared with the baseline in plain double precision.

#include "kv/capture_loader.h"
#include "synth/synthetic_capture.h"

#include <QProcess>
#include <QTemporaryDir>
#include <QTest>

#include <cmath>

using namespace kvscope;

namespace {

// max |ref - x| / max |ref| over head_dim, computed here independently.
double relativeLinf(const float* ref, const float* x, int dim)
{
    double maxDiff = 0, maxRef = 0;
    for (int d = 0; d < dim; ++d) {
        maxDiff = std::max(maxDiff, std::fabs(double(ref[d]) - double(x[d])));
        maxRef = std::max(maxRef, std::fabs(double(ref[d])));
    }
    return maxDiff / std::max(maxRef, 1e-10);
}

}  // namespace

class TestSyntheticCapture : public QObject {
    Q_OBJECT

private slots:
    void initTestCase();
    void layoutMatchesTheRules();
    void engineMatchesBaselineExceptTheFault();
    void cliInspect();
    void cliAnalyze();

private:
    QTemporaryDir m_dir;
    QString m_path;
    SyntheticCaptureOptions m_options = demoCaptureOptions();
};

void TestSyntheticCapture::initTestCase()
{
    m_path = m_dir.filePath("demo.h5");
    writeSyntheticCapture(m_path.toStdString(), m_options);
}

void TestSyntheticCapture::layoutMatchesTheRules()
{
    auto reader = std::make_shared<BundleReader>(m_path.toStdString());
    QVERIFY(reader->validate().empty());
    const CaptureLoader loader(reader);
    QCOMPARE(reader->prompts().size(), m_options.promptLens.size());
    for (const PromptInfo& p : reader->prompts()) {
        const std::int64_t seqLen = p.promptLen + m_options.decodeTokens;
        QCOMPARE(loader.sequenceLength(p.id), seqLen);
        QCOMPARE(p.snapshots.size(), std::size_t(2));
        // Only referenced blocks are stored, and the null block is never one of them.
        QVERIFY(!p.snapshots[0].storedBlockIds.empty());
        QVERIFY(p.snapshots[0].storedBlockIds.front() > 0);
        for (const std::string& layer : reader->config().layerNames()) {
            const bool sliding = reader->config().groups[std::size_t(reader->config().groupOf(layer))].specType ==
                                 SpecType::SlidingWindow;
            const LayerKv engine = loader.engineLayer(p.id, layer);
            const LayerKv expected = loader.referenceLayer(p.id, ReferenceRole::Expected, layer);
            for (std::int64_t pos = 0; pos < seqLen; ++pos) {
                // Engine: snapshot 0 (written divergence + 1, validated to the divergence) holds the
                // window before it; snapshot 1 (written seqLen - 1) the rest. The last position is never written.
                const std::int64_t div = p.divergencePositions.at(0);
                const std::int64_t firstHeld0 = sliding ? std::max<std::int64_t>(0, div + 1 - m_options.slidingWindow + 1) : 0;
                const std::int64_t firstHeld1 = sliding ? seqLen - 1 - m_options.slidingWindow + 1 : 0;
                const bool engineHeld = pos < div ? pos >= firstHeld0 : (pos >= firstHeld1 && pos < seqLen - 1);
                QCOMPARE(bool(engine.present[std::size_t(pos)]), engineHeld);
                const bool refHeld = !sliding || pos >= seqLen - (m_options.slidingWindow - 1);
                QCOMPARE(bool(expected.present[std::size_t(pos)]), refHeld);
            }
        }
    }
}

void TestSyntheticCapture::engineMatchesBaselineExceptTheFault()
{
    const CaptureLoader loader(std::make_shared<BundleReader>(m_path.toStdString()));
    const std::string faultLayer = "model.layers." + std::to_string(m_options.faultLayer) + ".self_attn";
    for (const PromptInfo& p : loader.prompts()) {
        for (const std::string& layer : loader.config().layerNames()) {
            const LayerKv engine = loader.engineLayer(p.id, layer);
            const LayerKv baseline = loader.referenceLayer(p.id, ReferenceRole::Baseline, layer);
            for (std::int64_t pos = 0; pos < engine.seq; ++pos) {
                if (!engine.present[std::size_t(pos)] || !baseline.present[std::size_t(pos)])
                    continue;
                for (int h = 0; h < engine.heads; ++h) {
                    const double v = relativeLinf(baseline.vAt(h, pos), engine.vAt(h, pos), engine.headDim(KvPart::V));
                    const double k = relativeLinf(baseline.kAt(h, pos), engine.kAt(h, pos), engine.headDim(KvPart::K));
                    QVERIFY2(v < 0.02, qPrintable(QString("V error %1 at pos %2").arg(v).arg(pos)));
                    const bool faulty = layer == faultLayer && h == m_options.faultHead &&
                                        pos >= p.promptLen + m_options.faultPosition;
                    // bf16 rounding of a perturbation: a few ulps (2^-8 relative) at most.
                    if (faulty)
                        QVERIFY2(k > 0.05, qPrintable(QString("fault not visible at pos %1: %2").arg(pos).arg(k)));
                    else
                        QVERIFY2(k < 0.02, qPrintable(QString::fromStdString(layer) +
                                                      QString(" head %1 pos %2: K error %3").arg(h).arg(pos).arg(k)));
                }
            }
        }
    }
}

void TestSyntheticCapture::cliInspect()
{
    QProcess ok;
    ok.start(KVSCOPE_BINARY, {"inspect", m_path});
    QVERIFY(ok.waitForFinished(60000));
    QCOMPARE(ok.exitCode(), 0);
    const QString out = ok.readAllStandardOutput();
    QVERIFY(out.contains("TP 2 (partitioned"));
    QVERIFY(out.contains("SlidingWindowSpec (sliding_window 24), block_size 8"));
    QVERIFY(out.contains("model.layers.7.self_attn"));

    const QString text = m_dir.filePath("notes.txt");
    QFile f(text);
    QVERIFY(f.open(QIODevice::WriteOnly));
    f.write("not a bundle");
    f.close();
    QProcess bad;
    bad.start(KVSCOPE_BINARY, {"inspect", text});
    QVERIFY(bad.waitForFinished(60000));
    QCOMPARE(bad.exitCode(), 2);
    const QString err = bad.readAllStandardError();
    QVERIFY2(err.contains(text) && err.contains("not an HDF5 file"), qPrintable(err));
}

void TestSyntheticCapture::cliAnalyze()
{
    auto run = [](const QStringList& args, int expectCode) {
        QProcess p;
        p.start(KVSCOPE_BINARY, args);
        if (!p.waitForFinished(120000))
            return QString("timeout");
        const QString all = p.readAllStandardOutput() + p.readAllStandardError();
        if (p.exitCode() != expectCode)
            return QString("exit %1: %2").arg(p.exitCode()).arg(all);
        return all;
    };
    // The summary names the injected fault first.
    const QString summary = run({"analyze", m_path}, 0);
    const int worst = summary.indexOf("worst cells");
    QVERIFY2(worst > 0, qPrintable(summary));
    QVERIFY2(summary.indexOf("model.layers.5.self_attn", worst) - worst < 120, qPrintable(summary));
    QVERIFY(summary.contains("divergences: 49 (recorded)"));

    const QString json = m_dir.filePath("out.json");
    QVERIFY(run({"analyze", m_path, "--json", json, "--layers", "4-5", "--prompt", "prompt_1"}, 0).contains("wrote"));
    QFile f(json);
    QVERIFY(f.open(QIODevice::ReadOnly));
    const QByteArray text = f.readAll();
    QVERIFY(text.contains("\"layer_names\":[\"model.layers.4.self_attn\",\"model.layers.5.self_attn\"]"));
    QVERIFY(!text.contains("NaN"));

    QVERIFY(run({"analyze", m_path, "--layers", "9"}, 2).contains("outside 0-7"));
    QVERIFY(run({"analyze", m_path, "--prompt", "nope"}, 2).contains("no such prompt"));
    QVERIFY(run({"analyze"}, 2).contains("usage"));
}

QTEST_GUILESS_MAIN(TestSyntheticCapture)
#include "tst_synthetic_capture.moc"
