// The synthetic hybrid model's capture (core/synth, --hybrid): Mamba2 layers alternating with
// attention, their recurrent state written per TP rank as vLLM shards it, with the references',
// at the checkpoints the format says; and each state fault changing exactly the state it names,
// the engine running on from it. What is expected is worked out here from the format and vLLM's
// sharding rule (docs/bundle-format.md, "Recurrent state"), not asked of the generator.

#include "format/bundle_error.h"
#include "format/bundle_reader.h"
#include "synth/model_capture.h"
#include "synth/state_capture.h"

#include <nlohmann/json.hpp>

#include <QProcess>
#include <QTemporaryDir>
#include <QTest>

#include <bit>
#include <cmath>
#include <map>

using namespace kvscope;
using namespace kvscope::synth;

Q_DECLARE_METATYPE(kvscope::synth::FaultKind)

namespace {

// 5 layers: Mamba2 at 0, 2, 4 (4 heads of 8: 32 x channels; d_state 8, 2 groups: B and C 16
// channels each; d_conv 4), attention at 1 and 3; TP 2; checkpoints every 8 positions.
// prompt_0 runs 20 + 6 tokens, prompt_1 28 + 6.
ModelCaptureOptions hybridModel(FaultKind fault = FaultKind::None)
{
    ModelCaptureOptions o;
    o.shape.layers = 5;
    o.shape.hidden = 32;
    o.shape.queryHeads = 4;
    o.shape.kvHeads = 2;
    o.shape.headDim = 16;
    o.shape.ffn = 64;
    o.shape.vocab = 64;
    o.shape.window = 8;
    o.shape.mamba.heads = 4;
    o.shape.mamba.headDim = 8;
    o.shape.mamba.stateSize = 8;
    o.shape.mamba.groups = 2;
    o.shape.mamba.convWidth = 4;
    o.hybrid = true;
    o.tpSize = 2;
    o.fullBlockSize = 8;
    o.slidingBlockSize = 4;
    o.promptLens = {20, 28};
    o.decodeTokens = 6;
    o.fault = fault;
    o.threads = 1;
    return o;
}

// The engine's run absorbs every token but the last teacher token: checkpoints at multiples of
// 8 below that, and at its end.
const std::map<std::string, std::vector<std::int64_t>> kPositions{{"prompt_0", {8, 16, 24, 25}},
                                                                  {"prompt_1", {8, 16, 24, 32, 33}}};
const std::vector<std::string> kMixers{"model.layers.0.mixer", "model.layers.2.mixer", "model.layers.4.mixer"};

float bf16(float x)
{
    std::uint32_t bits = std::bit_cast<std::uint32_t>(x);
    bits += 0x7fffu + ((bits >> 16) & 1u);
    return std::bit_cast<float>(bits & 0xffff0000u);
}

// One checkpoint of a layer's state, whole: conv [channels, 3] and ssm [heads, 8, 8], as floats.
struct WholeState {
    std::vector<float> conv, ssm;
    bool operator==(const WholeState&) const = default;
};

// The engine's ranks put back together by their units (each unit read from the first rank
// holding it; a later rank holding it must agree).
std::vector<WholeState> assemble(const LayerStateRecord& engine, std::int64_t convUnits, std::int64_t heads)
{
    std::vector<WholeState> out(engine.positions.size());
    std::vector<std::vector<bool>> seen(2);
    for (const auto& rank : engine.ranks)
        for (const StatePart& part : rank) {
            const bool conv = part.name == "conv";
            const std::vector<float> values = part.tensor.toFloat();
            const std::int64_t rows = part.tensor.shape[1], row = part.tensor.stride(1);
            const std::int64_t units = conv ? convUnits : heads;
            for (std::size_t c = 0; c < out.size(); ++c) {
                std::vector<float>& whole = conv ? out[c].conv : out[c].ssm;
                whole.resize(std::size_t(units * row), std::nanf(""));
                for (std::int64_t i = 0; i < rows; ++i) {
                    const std::int64_t u = part.units[std::size_t(i)];
                    const float* src = values.data() + (std::int64_t(c) * rows + i) * row;
                    float* dst = whole.data() + u * row;
                    if (!std::isnan(dst[0]))
                        for (std::int64_t k = 0; k < row; ++k)
                            if (dst[k] != src[k])
                                throw std::runtime_error("replicas of unit " + std::to_string(u) + " differ");
                    std::copy_n(src, row, dst);
                }
            }
        }
    return out;
}

std::vector<WholeState> referenceStates(const LayerStateRecord& ref)
{
    std::vector<WholeState> out(ref.positions.size());
    for (const StatePart& part : ref.ranks.at(0)) {
        const std::vector<float> values = part.tensor.toFloat();
        const std::size_t each = values.size() / out.size();
        for (std::size_t c = 0; c < out.size(); ++c)
            (part.name == "conv" ? out[c].conv : out[c].ssm)
                .assign(values.begin() + std::ptrdiff_t(c * each), values.begin() + std::ptrdiff_t((c + 1) * each));
    }
    return out;
}

double relativeL2(const std::vector<float>& a, const std::vector<float>& b)
{
    double err = 0, norm = 0;
    for (std::size_t i = 0; i < a.size(); ++i)
        err += (double(a[i]) - b[i]) * (double(a[i]) - b[i]), norm += double(b[i]) * b[i];
    return std::sqrt(err / norm);
}

// Every prompt's engine states of every mixer, whole, by prompt and layer.
using Captured = std::map<std::pair<std::string, std::string>, std::vector<WholeState>>;
Captured engineStates(const BundleReader& r, std::int64_t convUnits = 64, std::int64_t heads = 4)
{
    Captured out;
    for (const PromptInfo& p : r.prompts())
        for (const std::string& layer : kMixers)
            out[{p.id, layer}] = assemble(r.readEngineState(p.id, layer), convUnits, heads);
    return out;
}
Captured expectedStates(const BundleReader& r)
{
    Captured out;
    for (const PromptInfo& p : r.prompts())
        for (const std::string& layer : kMixers)
            out[{p.id, layer}] = referenceStates(*r.readReferenceState(p.id, ReferenceRole::Expected, layer));
    return out;
}

bool same(const WholeState& a, const WholeState& b)
{
    return a == b;
}

}  // namespace

class TestHybridCapture : public QObject {
    Q_OBJECT

private slots:
    void initTestCase()
    {
        QVERIFY(m_dir.isValid());
        writeModelCapture(path("clean.h5"), hybridModel());
    }

    void checkpoints()
    {
        QCOMPARE(checkpointPositions(25, 8), (std::vector<std::int64_t>{8, 16, 24, 25}));
        QCOMPARE(checkpointPositions(24, 8), (std::vector<std::int64_t>{8, 16, 24}));
        QCOMPARE(checkpointPositions(5, 8), (std::vector<std::int64_t>{5}));
        QCOMPARE(mixerLayerName(4), std::string("model.layers.4.mixer"));
    }

    // Every Mamba2 layer of every prompt: the engine's state per rank, units as vLLM shards them
    // (rank r: x channels 16r..16r+15, its group's B (32 + 8r..) and C (48 + 8r..); heads 2r, 2r+1),
    // conv bf16 and SSM fp32; the references whole (expected bf16, baseline fp32); the positions;
    // the MambaSpec group listing the mixers; no KV for them, KV for the attention layers.
    void statesWritten()
    {
        const BundleReader r(path("clean.h5"));
        const KvCacheConfig& cfg = r.config();
        for (const std::string& layer : kMixers) {
            QVERIFY(cfg.groupOf(layer) >= 0);
            QCOMPARE(cfg.groups[std::size_t(cfg.groupOf(layer))].specType, SpecType::NotCompared);
        }
        QVERIFY(cfg.isCompared("model.layers.1.self_attn") && cfg.isCompared("model.layers.3.self_attn"));
        for (const PromptInfo& p : r.prompts()) {
            QCOMPARE(p.stateLayers, kMixers);
            const std::vector<std::int64_t>& positions = kPositions.at(p.id);
            const std::int64_t c = std::int64_t(positions.size());
            for (const std::string& layer : kMixers) {
                const LayerStateRecord e = r.readEngineState(p.id, layer);
                QCOMPARE(e.kind, std::string("mamba2"));
                QCOMPARE(e.positions, positions);
                QCOMPARE(e.ranks.size(), std::size_t(2));
                for (std::int64_t rank = 0; rank < 2; ++rank) {
                    const auto& parts = e.ranks[std::size_t(rank)];
                    QCOMPARE(parts.size(), std::size_t(2));
                    const StatePart& conv = parts[0].name == "conv" ? parts[0] : parts[1];
                    const StatePart& ssm = parts[0].name == "conv" ? parts[1] : parts[0];
                    std::vector<std::int64_t> convUnits;
                    for (std::int64_t i = 0; i < 16; ++i)
                        convUnits.push_back(16 * rank + i);
                    for (std::int64_t i = 0; i < 8; ++i)
                        convUnits.push_back(32 + 8 * rank + i);
                    for (std::int64_t i = 0; i < 8; ++i)
                        convUnits.push_back(48 + 8 * rank + i);
                    QCOMPARE(conv.units, convUnits);
                    QCOMPARE(conv.tensor.shape, (std::vector<std::int64_t>{c, 32, 3}));
                    QCOMPARE(conv.tensor.dtype, DType::BFloat16);
                    QCOMPARE(ssm.units, (std::vector<std::int64_t>{2 * rank, 2 * rank + 1}));
                    QCOMPARE(ssm.tensor.shape, (std::vector<std::int64_t>{c, 2, 8, 8}));
                    QCOMPARE(ssm.tensor.dtype, DType::Float32);
                }
                for (ReferenceRole role : {ReferenceRole::Expected, ReferenceRole::Baseline}) {
                    const std::optional<LayerStateRecord> ref = r.readReferenceState(p.id, role, layer);
                    QVERIFY(ref);
                    QCOMPARE(ref->positions, positions);
                    const DType dtype = role == ReferenceRole::Expected ? DType::BFloat16 : DType::Float32;
                    for (const StatePart& part : ref->ranks.at(0)) {
                        QCOMPARE(part.tensor.dtype, dtype);
                        QCOMPARE(part.tensor.shape, part.name == "conv" ? (std::vector<std::int64_t>{c, 64, 3})
                                                                        : (std::vector<std::int64_t>{c, 4, 8, 8}));
                    }
                }
            }
            QVERIFY_THROWS_EXCEPTION(BundleError, r.readReference(p.id, ReferenceRole::Expected, "model.layers.0.mixer"));
            QCOMPARE(r.readReference(p.id, ReferenceRole::Expected, "model.layers.1.self_attn").k.shape[2],
                     std::int64_t(positions.back() + 1));
        }
    }

    // A clean capture: the engine's states and the baseline's near the expected (HF's bf16):
    // bf16 noise through a few layers, a few percent (measured: at most 3.3% relative L2; a
    // state fault is 50-100%), but not the same numbers (other rounding); printed with -v1.
    void cleanStatesNearTheReference()
    {
        const BundleReader r(path("clean.h5"));
        const Captured engine = engineStates(r), expected = expectedStates(r);
        double worst = 0;
        for (const auto& [key, states] : engine) {
            const std::vector<WholeState>& ref = expected.at(key);
            const std::vector<WholeState> base =
                referenceStates(*r.readReferenceState(key.first, ReferenceRole::Baseline, key.second));
            for (std::size_t c = 0; c < states.size(); ++c) {
                const double e = relativeL2(states[c].ssm, ref[c].ssm), b = relativeL2(base[c].ssm, ref[c].ssm);
                worst = std::max({worst, e, b, relativeL2(states[c].conv, ref[c].conv)});
                QVERIFY2(e < 0.1 && b < 0.1, qPrintable(QString("%1 %2 checkpoint %3: engine %4, baseline %5")
                                                              .arg(key.first.c_str(), key.second.c_str())
                                                              .arg(c).arg(e).arg(b)));
                QVERIFY(states[c].ssm != ref[c].ssm);
            }
        }
        qInfo("clean: worst relative L2 against expected %.3g", worst);
    }

    // One group replicated over both ranks (n_groups 1, vLLM's extra_groups_for_head_shards):
    // each rank holds group 0's B and C (channels 32-39, 40-47 of 48), the same values.
    void oneGroupReplicated()
    {
        ModelCaptureOptions o = hybridModel();
        o.shape.mamba.groups = 1;
        o.promptLens = {12};
        writeModelCapture(path("one_group.h5"), o);
        const BundleReader r(path("one_group.h5"));
        const LayerStateRecord e = r.readEngineState("prompt_0", "model.layers.2.mixer");
        for (std::int64_t rank = 0; rank < 2; ++rank) {
            std::vector<std::int64_t> units;
            for (std::int64_t i = 0; i < 16; ++i)
                units.push_back(16 * rank + i);
            for (std::int64_t i = 32; i < 48; ++i)  // B of group 0, then C of group 0
                units.push_back(i);
            const StatePart& conv = e.ranks[std::size_t(rank)][0].name == "conv" ? e.ranks[std::size_t(rank)][0]
                                                                                 : e.ranks[std::size_t(rank)][1];
            QCOMPARE(conv.units, units);
        }
        assemble(e, 48, 4);  // throws if the replicas differ
    }

    void faultChangesExactlyWhatItSays_data()
    {
        QTest::addColumn<FaultKind>("kind");
        for (FaultKind k : stateFaultKinds())
            QTest::newRow(faultName(k).c_str()) << k;
    }

    // Against the clean capture: the fault's prompt, layer and checkpoint hold exactly what the
    // fault says (worked out from the clean states); every state before it, of the layers
    // before it and of the other prompt is the clean one, bit for bit; the layers from it on
    // drift at the checkpoints after it (the engine ran on); the references are untouched.
    // The fault's place: the Mamba2 layer nearest the middle (2); the first checkpoint from
    // prompt_len - 10 (the shortest prompt's half): prompt_0 at 16, prompt_1 at 24.
    void faultChangesExactlyWhatItSays()
    {
        QFETCH(FaultKind, kind);
        const std::string file = path(faultName(kind) + ".h5");
        writeModelCapture(file, hybridModel(kind));
        const BundleReader clean(path("clean.h5")), faulty(file);
        const nlohmann::json truth = nlohmann::json::parse(faulty.metadata().extra.at("synthetic_fault"));
        const bool second = kind == FaultKind::StateOtherRequest || kind == FaultKind::StateNotReset;
        const std::string prompt = second ? "prompt_1" : "prompt_0";
        const std::int64_t position = second ? 24 : 16;
        QCOMPARE(truth.at("kind").get<std::string>(), faultName(kind));
        QCOMPARE(truth.at("layer").get<std::string>(), std::string("model.layers.2.mixer"));
        QCOMPARE(truth.at("prompt").get<std::string>(), prompt);
        QCOMPARE(truth.at("position").get<std::int64_t>(), position);

        const Captured before = engineStates(clean), after = engineStates(faulty);
        QVERIFY(expectedStates(clean) == expectedStates(faulty));
        const std::vector<std::int64_t>& positions = kPositions.at(prompt);
        const std::size_t at = std::size_t(std::find(positions.begin(), positions.end(), position) - positions.begin());
        const WholeState& was = before.at({prompt, kMixers[1]})[at];
        WholeState want;
        switch (kind) {
        case FaultKind::StateStale:
            want = before.at({prompt, kMixers[1]})[at - 1];  // the checkpoint 8 positions earlier
            break;
        case FaultKind::StateOtherRequest:
            want = before.at({"prompt_0", kMixers[1]})[2];  // prompt_0's at 24
            break;
        case FaultKind::StateNotReset: {
            const WholeState& leftover = before.at({"prompt_0", kMixers[1]}).back();  // prompt_0's end, 25
            want = was;
            for (std::size_t i = 0; i < want.conv.size(); ++i)
                want.conv[i] = bf16(was.conv[i] + 0.5f * leftover.conv[i]);
            for (std::size_t i = 0; i < want.ssm.size(); ++i)
                want.ssm[i] = was.ssm[i] + 0.5f * leftover.ssm[i];
            QCOMPARE(truth.at("factor").get<double>(), 0.5);
            break;
        }
        case FaultKind::StateZeros:
            want.conv.assign(was.conv.size(), 0.0f);
            want.ssm.assign(was.ssm.size(), 0.0f);
            break;
        default:  // state_scale
            want = was;
            for (float& x : want.conv)
                x *= 0.5f;
            for (float& x : want.ssm)
                x *= 0.5f;
            QCOMPARE(truth.at("factor").get<double>(), 0.5);
            break;
        }
        QVERIFY(!same(want, was));
        QVERIFY(same(after.at({prompt, kMixers[1]})[at], want));
        for (const auto& [key, states] : after) {
            const std::vector<WholeState>& cleanStates = before.at(key);
            const int layer = int(std::find(kMixers.begin(), kMixers.end(), key.second) - kMixers.begin());
            for (std::size_t c = 0; c < states.size(); ++c) {
                const bool untouched = key.first != prompt || layer == 0 || c < at;
                if (untouched)
                    QVERIFY2(same(states[c], cleanStates[c]),
                             qPrintable(QString("%1 %2 checkpoint %3 changed").arg(key.first.c_str(), key.second.c_str()).arg(c)));
            }
            if (key.first == prompt && layer >= 1)  // the engine ran on from the wrong state
                QVERIFY2(!same(states.back(), cleanStates.back()),
                         qPrintable(QString("%1 %2: no drift at its end").arg(key.first.c_str(), key.second.c_str())));
        }
    }

    // An attention fault (Q and K of prompt positions [len/8, 5 len/8) rotated for position + 3,
    // layer 1): the Mamba2 layer before it keeps its clean states, the ones after it drift from
    // the first checkpoint past the fault's first position.
    void attentionFaultDriftsLaterStates()
    {
        ModelCaptureOptions o = hybridModel(FaultKind::RopePrefill);
        o.faultLayer = 1;
        writeModelCapture(path("rope_prefill.h5"), o);
        const BundleReader clean(path("clean.h5")), faulty(path("rope_prefill.h5"));
        const Captured before = engineStates(clean), after = engineStates(faulty);
        for (const auto& [key, states] : after) {
            const std::vector<WholeState>& cleanStates = before.at(key);
            for (std::size_t c = 0; c < states.size(); ++c)
                if (key.second == kMixers[0])
                    QVERIFY(same(states[c], cleanStates[c]));
                else
                    QVERIFY2(!same(states[c], cleanStates[c]),
                             qPrintable(QString("%1 %2 checkpoint %3 unchanged").arg(key.first.c_str(), key.second.c_str()).arg(c)));
        }
    }

    void refusals_data()
    {
        QTest::addColumn<QString>("what");
        QTest::addColumn<QString>("message");
        QTest::newRow("state fault, no hybrid") << "no_hybrid" << "needs a hybrid model";
        QTest::newRow("state fault on attention") << "attention_layer" << "needs a Mamba2 layer";
        QTest::newRow("groups over tp") << "groups" << "Mamba2 groups (2) must divide evenly over tp_size 4";
        QTest::newRow("heads over tp") << "heads" << "Mamba2 heads (4) must divide evenly over tp_size 8";
        QTest::newRow("one prompt") << "one_prompt" << "it needs two prompts";
        QTest::newRow("attention fault on a mixer") << "rope_on_mixer" << "is a state-space layer";
        QTest::newRow("past the run") << "late" << "is past prompt_0's run";
    }

    void refusals()
    {
        QFETCH(QString, what);
        QFETCH(QString, message);
        ModelCaptureOptions o = hybridModel(FaultKind::StateZeros);
        if (what == "no_hybrid")
            o.hybrid = false;
        if (what == "attention_layer")
            o.faultLayer = 3;
        if (what == "groups")
            o.tpSize = 4, o.shape.kvHeads = 4;
        if (what == "heads")
            o.tpSize = 8, o.shape.kvHeads = 8, o.shape.queryHeads = 8, o.shape.mamba.groups = 1;
        if (what == "one_prompt")
            o.fault = FaultKind::StateOtherRequest, o.promptLens = {20};
        if (what == "rope_on_mixer")
            o.fault = FaultKind::RopeOffset, o.faultLayer = 2;
        if (what == "late")
            o.faultStep = 5;
        try {
            writeModelCapture(path("refused.h5"), o);
            QFAIL("not refused");
        } catch (const std::invalid_argument& e) {
            QVERIFY2(QString(e.what()).contains(message), e.what());
        }
    }

    // kvscope synth's options: the mixer's shape, the engine's SSM dtype, a state fault; a
    // dtype it does not take refused (exit 2).
    void commandLine()
    {
        const auto run = [](const QStringList& args, QString* err = nullptr) {
            QProcess p;
            p.start(KVSCOPE_BINARY, args);
            if (!p.waitForFinished(120000))
                return -1;
            if (err)
                *err = QString::fromUtf8(p.readAllStandardError());
            return p.exitStatus() == QProcess::NormalExit ? p.exitCode() : -1;
        };
        const QString out = QString::fromStdString(path("cli.h5"));
        QCOMPARE(run({"synth", out, "--hybrid", "--layers", "4", "--hidden", "32", "--mamba-heads", "4", "--mamba-head-dim",
                      "8", "--mamba-state", "6", "--mamba-groups", "1", "--mamba-conv", "3", "--mamba-ssm-cache-dtype",
                      "bfloat16", "--prompts", "12,16", "--decode", "4", "--fault", "state_zeros"}),
                 0);
        const BundleReader r(out.toStdString());
        const LayerStateRecord e = r.readEngineState("prompt_1", "model.layers.2.mixer");
        QCOMPARE(e.positions, (std::vector<std::int64_t>{8, 16, 19}));
        for (const StatePart& part : e.ranks.at(1))
            QCOMPARE(part.tensor.shape, part.name == "ssm" ? (std::vector<std::int64_t>{3, 2, 8, 6})
                                                           : (std::vector<std::int64_t>{3, 16 + 12, 2}));
        for (const StatePart& part : e.ranks.at(0))
            QCOMPARE(part.tensor.dtype, DType::BFloat16);
        const nlohmann::json options = nlohmann::json::parse(r.metadata().extra.at("synthetic_options"));
        QVERIFY(options.at("state_space_layers") == nlohmann::json({0, 2}));
        QCOMPARE(options.at("mamba2").at("ssm_cache_dtype").get<std::string>(), std::string("bfloat16"));
        QCOMPARE(nlohmann::json::parse(r.metadata().extra.at("synthetic_fault")).at("kind").get<std::string>(),
                 std::string("state_zeros"));
        QString err;
        QCOMPARE(run({"synth", out, "--hybrid", "--mamba-ssm-cache-dtype", "float16"}, &err), 2);
        QVERIFY2(err.contains("--mamba-ssm-cache-dtype takes float32 or bfloat16"), qPrintable(err));
    }

private:
    std::string path(const std::string& name) const { return m_dir.filePath(QString::fromStdString(name)).toStdString(); }
    QTemporaryDir m_dir;
};

QTEST_APPLESS_MAIN(TestHybridCapture)
#include "tst_hybrid_capture.moc"
