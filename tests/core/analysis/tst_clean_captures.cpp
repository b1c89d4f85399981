// Clean captures, none of which may get a suspect (issue #54): every shape `kvscope synth`
// makes, each made by the command as a user runs it and analysed as `kvscope analyze` does.
// Three-way and two-way; TP 1, 2, 4 and 8 with split and replicated heads; sliding, full and
// chunked windows; MLA; decode context parallelism; bf16, fp8 e4m3 / e5m2 / e4m3fnuz, int8
// with each scale granularity and vLLM's per-token-head, int4 and nvfp4 formats; Llama 3 RoPE
// scaling; seeds; hybrid models; 80 layers and prompts of 8192 tokens (model-free, where the
// model would be too slow). Each capture is first checked to be what its options say (read
// back from the bundle), so that a row cannot pass by testing another shape. A failure prints
// the command lines that reproduce it and every suspect found.

#include "analysis/analyzer.h"
#include "analysis/suspect.h"
#include "format/bundle_reader.h"
#include "format/dtype.h"
#include "format/kv_cache_config.h"
#include "format/raw_tensor.h"
#include "format/rope_settings.h"

#include <QElapsedTimer>
#include <QFile>
#include <QProcess>
#include <QTemporaryDir>
#include <QTest>

#include <memory>
#include <set>

using namespace kvscope;

namespace {

// The model of the bigger rows: 8 layers, 4 KV heads of 64, prompts of 300 and 700 tokens.
const QStringList kBigger = {"--layers", "8",       "--kv-heads", "4",       "--query-heads", "8",  "--head-dim",
                             "64",       "--hidden", "128",       "--prompts", "300,700",     "--decode", "32"};
// The demo's model (8 KV heads of 128 over TP 4, a quiet head in layer 0), 4 layers of it.
const QStringList kDemoSmall = {"--demo", "--fault", "none", "--layers", "4", "--prompts", "100,180", "--decode", "16"};

// What a capture is, read back from the bundle: "4 layers", "tp 4 replicated", "dcp 2",
// "SlidingWindowSpec", "float8_e4m3fn head scales", "rope llama3", "mla", "two-way",
// "2 not compared", "prompt 8192", ... one fact an entry.
QStringList captureFacts(const BundleReader& reader)
{
    const KvCacheConfig& config = reader.config();
    QStringList facts;
    const std::vector<std::string> layers = config.layerNames();
    facts << QString("%1 layers").arg(layers.size());
    if (const std::size_t n = config.notComparedLayers().size(); n > 0)
        facts << QString("%1 not compared").arg(n);
    if (const std::size_t n = reader.prompts().front().stateLayers.size(); n > 0)
        facts << QString("%1 state layers").arg(n);  // their recurrent state held (and compared)
    const bool split = config.layout(config.firstCompared()).mode() == TpMode::Partitioned;
    facts << QString("tp %1 %2").arg(config.tpSize).arg(split ? "split" : "replicated");
    if (config.dcpSize > 1)
        facts << QString("dcp %1").arg(config.dcpSize);
    if (config.isMla())
        facts << "mla";
    std::set<std::string> specs;
    for (const KvCacheGroup& g : config.groups)
        specs.insert(specTypeName(g.specType));
    for (const std::string& spec : specs)
        facts << QString::fromStdString(spec);
    const KvCacheGroup& group = config.firstCompared();
    QString dtype = QString::fromStdString(dtypeName(group.dtype));
    if (group.quantised()) {
        // The scales as stored: one shard of the first layer tells their granularity.
        const PromptInfo& p = reader.prompts().front();
        const PagedShard shard = reader.readEngineShard(p.id, 0, 0, layers.front(), KvPart::K, nullptr);
        dtype += QString(" %1 scales").arg(granularityName(shard.blocks.granularity()));
    }
    facts << dtype;
    const std::optional<RopeSettings> rope = ropeSettingsOf(reader.metadata(), reader.path());
    facts << QString("rope %1").arg(rope ? QString::fromStdString(ropeScalingName(rope->scaling.type)) : "none");
    bool threeWay = true;
    for (const PromptInfo& p : reader.prompts()) {
        threeWay = threeWay && p.hasBaseline;
        facts << QString("prompt %1").arg(p.promptLen);
    }
    facts << (threeWay ? "three-way" : "two-way");
    return facts;
}

}  // namespace

class TestCleanCaptures : public QObject {
    Q_OBJECT

private slots:
    void noSuspect_data();
    void noSuspect();
    void faultsThroughTheSamePathAreFound_data();
    void faultsThroughTheSamePathAreFound();

private:
    struct Analysed {
        QStringList facts;
        std::vector<Suspect> suspects;
        QString reproduce;  // the command lines
    };
    // Makes the capture with `kvscope synth OUT ARGS` and analyses it as `kvscope analyze` does.
    bool analyse(const QStringList& synthArgs, Analysed& out);
    QTemporaryDir m_dir;
};

void TestCleanCaptures::noSuspect_data()
{
    QTest::addColumn<QStringList>("synthArgs");
    QTest::addColumn<QStringList>("expected");  // facts the capture must show (captureFacts)
    auto row = [](const char* name, QStringList args, QStringList expected) {
        QTest::newRow(name) << args << expected;
    };
    // The default model (4 layers, 2 KV heads of 16 over TP 2), three-way and two-way, seeds.
    row("default", {}, {"tp 2 split", "three-way", "rope default"});
    row("two-way", {"--two-way"}, {"two-way"});
    row("seed 7", {"--seed", "7"}, {"three-way"});
    row("seed 11, two-way", {"--seed", "11", "--two-way"}, {"two-way"});
    row("seed 23, five prompts", {"--seed", "23", "--prompts", "5,17,33,64,100", "--decode", "4"},
        {"prompt 5", "prompt 100"});
    // TP 1, 2, 4, 8; heads split over the ranks and replicated on them.
    row("tp 1", {"--tp", "1"}, {"tp 1 split"});
    row("tp 2 split, 4 heads", {"--kv-heads", "4", "--query-heads", "8"}, {"tp 2 split"});
    row("tp 4 split", {"--tp", "4", "--kv-heads", "4", "--query-heads", "8"}, {"tp 4 split"});
    row("tp 4 replicated", {"--tp", "4"}, {"tp 4 replicated"});
    row("tp 4 replicated, two-way", {"--tp", "4", "--two-way"}, {"tp 4 replicated", "two-way"});
    row("tp 8 split", {"--tp", "8", "--kv-heads", "8", "--query-heads", "8", "--hidden", "128"}, {"tp 8 split"});
    row("tp 8 split, two-way", {"--tp", "8", "--kv-heads", "8", "--query-heads", "8", "--hidden", "128", "--two-way"},
        {"tp 8 split", "two-way"});
    row("tp 8 replicated", {"--tp", "8", "--query-heads", "8"}, {"tp 8 replicated"});
    row("dcp 2 over tp 4", {"--tp", "4", "--dcp", "2"}, {"dcp 2", "tp 4 replicated"});
    row("dcp 2, runs of 4", {"--tp", "4", "--dcp", "2", "--cp-interleave", "4"}, {"dcp 2"});
    // Windows: sliding (blocks freed), full attention with a sliding window, chunked.
    row("full spec", {"--spec", "full"}, {"FullAttentionSpec"});
    row("sliding window 8", {"--spec", "sliding", "--window", "8"}, {"SlidingWindowSpec"});
    row("full spec window 32, two-way", {"--spec", "full", "--window", "32", "--two-way"}, {"two-way"});
    row("chunked", {"--spec", "chunked"}, {"ChunkedLocalAttentionSpec"});
    row("chunked, tp 4 split", {"--spec", "chunked", "--tp", "4", "--kv-heads", "4", "--query-heads", "8"},
        {"ChunkedLocalAttentionSpec", "tp 4 split"});
    row("block sizes 32 and 16", {"--block-size", "32", "--sliding-block-size", "16"}, {"three-way"});
    row("provenance recorded", {"--provenance", "prefix_cache:8,prefill:8,prefill"}, {"three-way"});
    // MLA.
    row("mla", {"--mla"}, {"mla"});
    row("mla, tp 4", {"--mla", "--tp", "4"}, {"mla", "tp 4 replicated"});
    row("mla, two-way", {"--mla", "--two-way"}, {"mla", "two-way"});
    row("mla, dcp 2", {"--mla", "--dcp", "2"}, {"mla", "dcp 2"});
    // Quantised caches, each scale granularity, and vLLM's own formats.
    row("fp8 e4m3, tensor", {"--kv-dtype", "fp8_e4m3"}, {"float8_e4m3fn tensor scales"});
    row("fp8 e4m3, head", {"--kv-dtype", "fp8_e4m3", "--kv-scale", "head"}, {"float8_e4m3fn head scales"});
    row("fp8 e4m3, token_head", {"--kv-dtype", "fp8_e4m3", "--kv-scale", "token_head"}, {"float8_e4m3fn token_head scales"});
    row("fp8 e5m2, tensor", {"--kv-dtype", "fp8_e5m2"}, {"float8_e5m2 tensor scales"});
    row("fp8 e5m2, head", {"--kv-dtype", "fp8_e5m2", "--kv-scale", "head"}, {"float8_e5m2 head scales"});
    row("fp8 e5m2, token_head", {"--kv-dtype", "fp8_e5m2", "--kv-scale", "token_head"}, {"float8_e5m2 token_head scales"});
    row("fp8 e4m3fnuz", {"--kv-dtype", "fp8_e4m3fnuz"}, {"float8_e4m3fnuz tensor scales"});
    row("int8, tensor", {"--kv-dtype", "int8"}, {"int8 tensor scales"});
    row("int8, head", {"--kv-dtype", "int8", "--kv-scale", "head"}, {"int8 head scales"});
    row("int8, token_head", {"--kv-dtype", "int8", "--kv-scale", "token_head"}, {"int8 token_head scales"});
    row("fp8_per_token_head", {"--kv-dtype", "fp8_per_token_head", "--head-dim", "32"}, {"float8_e4m3fn token_head scales"});
    row("int8_per_token_head", {"--kv-dtype", "int8_per_token_head", "--head-dim", "32"}, {"int8 token_head scales"});
    row("int4_per_token_head", {"--kv-dtype", "int4_per_token_head", "--head-dim", "32"}, {"int4_per_token_head token_head scales"});
    row("nvfp4", {"--kv-dtype", "nvfp4", "--head-dim", "32"}, {"float4_e2m1fn token_group scales"});
    row("fp8 e4m3, tp 4 replicated, two-way", {"--kv-dtype", "fp8_e4m3", "--tp", "4", "--two-way"},
        {"float8_e4m3fn tensor scales", "tp 4 replicated", "two-way"});
    // Llama 3 RoPE scaling (factor 8 over an original context of 32 positions).
    row("llama3", {"--rope-scaling", "llama3"}, {"rope llama3"});
    row("llama3, tp 4 replicated, two-way", {"--rope-scaling", "llama3", "--tp", "4", "--two-way"},
        {"rope llama3", "tp 4 replicated", "two-way"});
    row("llama3, fp8 e4m3 head", {"--rope-scaling", "llama3", "--kv-dtype", "fp8_e4m3", "--kv-scale", "head"},
        {"rope llama3", "float8_e4m3fn head scales"});
    row("llama3, prompts of 200 and 330", {"--rope-scaling", "llama3", "--prompts", "200,330", "--decode", "12"},
        {"rope llama3", "prompt 330"});
    row("llama3, prompts of 1024 and 2048, fp8 e4m3 head",
        {"--rope-scaling", "llama3", "--prompts", "1024,2048", "--decode", "16", "--kv-dtype", "fp8_e4m3", "--kv-scale",
         "head"},
        {"rope llama3", "prompt 2048", "float8_e4m3fn head scales"});
    row("llama3, a prompt of 8192 (2 layers)", {"--rope-scaling", "llama3", "--layers", "2", "--prompts", "8192", "--decode", "8"},
        {"rope llama3", "prompt 8192"});
    // Hybrid models: state-space layers listed, not compared.
    row("hybrid", {"--layers", "6", "--state-space-layers", "1,4"}, {"4 layers", "2 not compared"});
    row("hybrid, two-way", {"--layers", "6", "--state-space-layers", "2,3", "--two-way"}, {"2 not compared", "two-way"});
    // Hybrid models with their Mamba2 layers' recurrent state: compared too.
    row("hybrid, Mamba2 states", {"--hybrid", "--layers", "6"}, {"3 state layers"});
    row("hybrid, Mamba2 states, tp 4, one B/C group, two-way", {"--hybrid", "--tp", "4", "--mamba-groups", "1", "--two-way"},
        {"2 state layers", "two-way"});
    row("hybrid, bf16 SSM state, prompts of 300 and 700", {"--hybrid", "--mamba-ssm-cache-dtype", "bfloat16", "--prompts", "300,700"},
        {"2 state layers", "prompt 700"});
    // A bigger model: more cells, so more chances for the noise to look like a fault.
    row("bigger, bf16", kBigger, {"8 layers", "prompt 700"});
    row("bigger, fp8 e4m3 head", kBigger + QStringList{"--kv-dtype", "fp8_e4m3", "--kv-scale", "head"},
        {"float8_e4m3fn head scales"});
    row("bigger, fp8 e5m2 token_head", kBigger + QStringList{"--kv-dtype", "fp8_e5m2", "--kv-scale", "token_head"},
        {"float8_e5m2 token_head scales"});
    row("bigger, int8 tensor, two-way", kBigger + QStringList{"--kv-dtype", "int8", "--two-way"},
        {"int8 tensor scales", "two-way"});
    row("bigger, fp8_per_token_head", kBigger + QStringList{"--kv-dtype", "fp8_per_token_head"}, {"float8_e4m3fn token_head scales"});
    row("bigger, int8_per_token_head, tp 4 split", kBigger + QStringList{"--kv-dtype", "int8_per_token_head", "--tp", "4"},
        {"int8 token_head scales", "tp 4 split"});
    row("bigger, llama3, chunked 64", kBigger + QStringList{"--rope-scaling", "llama3", "--spec", "chunked", "--window", "64"},
        {"rope llama3", "ChunkedLocalAttentionSpec"});
    row("bigger, llama3, tp 8 replicated", kBigger + QStringList{"--rope-scaling", "llama3", "--tp", "8"},
        {"rope llama3", "tp 8 replicated"});
    // The demo's model (a quiet head that one fp8 scale per tensor crushes), 4 layers of it.
    row("demo model, fp8 e4m3 tensor", kDemoSmall + QStringList{"--kv-dtype", "fp8_e4m3"},
        {"tp 4 split", "float8_e4m3fn tensor scales"});
    row("demo model, int8 head", kDemoSmall + QStringList{"--kv-dtype", "int8", "--kv-scale", "head"},
        {"int8 head scales"});
    row("demo model, two-way", kDemoSmall + QStringList{"--two-way"}, {"two-way"});
    row("demo model, llama3, fp8 e4m3 token_head",
        kDemoSmall + QStringList{"--rope-scaling", "llama3", "--kv-dtype", "fp8_e4m3", "--kv-scale", "token_head"},
        {"rope llama3", "float8_e4m3fn token_head scales"});
    // 80 layers and 8192-token prompts: model-free, with the model's noise.
    row("model-free, 80 layers x 2048", {"--model-free", "--layers", "80", "--prompts", "2048", "--decode", "16"},
        {"80 layers", "prompt 2048", "three-way"});
    row("model-free, 80 layers x 2048, two-way, seed 3",
        {"--model-free", "--layers", "80", "--prompts", "2048", "--decode", "16", "--two-way", "--seed", "3"},
        {"80 layers", "two-way"});
    row("model-free, 80 layers x 8192, tp 4 split",
        {"--model-free", "--layers", "80", "--prompts", "8192", "--decode", "16", "--tp", "4", "--kv-heads", "4",
         "--query-heads", "8"},
        {"80 layers", "prompt 8192", "tp 4 split", "three-way"});
    row("model-free, 16 layers, prompts of 4096 and 8192, two-way, tp 4 replicated",
        {"--model-free", "--layers", "16", "--prompts", "4096,8192", "--decode", "16", "--two-way", "--tp", "4"},
        {"prompt 4096", "prompt 8192", "two-way", "tp 4 replicated"});
}

bool TestCleanCaptures::analyse(const QStringList& synthArgs, Analysed& out)
{
    const QString path = m_dir.filePath("capture.h5");
    QFile::remove(path);
    out.reproduce = QString("kvscope synth capture.h5 %1 && kvscope analyze capture.h5").arg(synthArgs.join(' '));
    QProcess synth;
    synth.start(KVSCOPE_BINARY, QStringList{"synth", path} + synthArgs);
    if (!synth.waitForFinished(600000) || synth.exitStatus() != QProcess::NormalExit || synth.exitCode() != 0) {
        qWarning("%s\nsynth failed: %s", qPrintable(out.reproduce), synth.readAllStandardError().constData());
        return false;
    }
    auto reader = std::make_shared<BundleReader>(path.toStdString());
    out.facts = captureFacts(*reader);
    out.suspects = analyzeBundle(reader).suspects;
    QFile::remove(path);
    return true;
}

void TestCleanCaptures::noSuspect()
{
    QFETCH(QStringList, synthArgs);
    QFETCH(QStringList, expected);
    QElapsedTimer timer;
    timer.start();
    Analysed a;
    QVERIFY(analyse(synthArgs, a));
    for (const QString& fact : expected)
        QVERIFY2(a.facts.contains(fact), qPrintable(QString("%1\nthe capture is not '%2': %3")
                                                        .arg(a.reproduce, fact, a.facts.join(", "))));
    QString found;
    for (const Suspect& s : a.suspects)
        found += QString("\n  %1/%2 at %3: %4")
                     .arg(suspectPatternName(s.pattern), QString::fromStdString(s.hypothesis.kind),
                          QString::fromStdString(s.firstLayer), QString::fromStdString(s.evidence));
    QVERIFY2(a.suspects.empty(), qPrintable(QString("a clean capture (%1) got %2 suspect(s); reproduce: %3%4")
                                                .arg(a.facts.join(", ")).arg(a.suspects.size()).arg(a.reproduce, found)));
    qInfo("%s: no suspect (%.1f s)", qPrintable(a.facts.join(", ")), timer.elapsed() / 1000.0);
}

// The harness can fail: the same options with a fault get a suspect, at the fault's layer.
void TestCleanCaptures::faultsThroughTheSamePathAreFound_data()
{
    QTest::addColumn<QStringList>("synthArgs");
    QTest::addColumn<QString>("layer");
    QTest::newRow("rope_offset, fp8 e4m3 head, llama3")
        << QStringList{"--fault", "rope_offset", "--fault-layer", "2", "--kv-dtype", "fp8_e4m3", "--kv-scale", "head",
                       "--rope-scaling", "llama3"}
        << "model.layers.2.self_attn";
    QTest::newRow("model-free, 80 layers, other_layer")
        << QStringList{"--model-free", "--layers", "80", "--prompts", "512", "--decode", "16", "--fault", "other_layer",
                       "--fault-layer", "40"}
        << "model.layers.40.self_attn";
}

void TestCleanCaptures::faultsThroughTheSamePathAreFound()
{
    QFETCH(QStringList, synthArgs);
    QFETCH(QString, layer);
    Analysed a;
    QVERIFY(analyse(synthArgs, a));
    QVERIFY2(!a.suspects.empty(), qPrintable(a.reproduce));
    QCOMPARE(QString::fromStdString(a.suspects.front().firstLayer), layer);
}

QTEST_GUILESS_MAIN(TestCleanCaptures)
#include "tst_clean_captures.moc"
