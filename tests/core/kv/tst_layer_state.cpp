// Recurrent state in bundles (docs/bundle-format.md, "Recurrent state"): the writer's checks, a
// round trip bit for bit, the ranks merged by their units (a replicated unit read once and its
// copies compared), the checkpoints compared, and bad input named by file, object and problem.

#include "format/bundle_error.h"
#include "format/bundle_reader.h"
#include "format/bundle_writer.h"
#include "format/recurrent_state.h"
#include "kv/layer_state.h"
#include "modify_bundle.h"
#include "test_support.h"

#include <QTemporaryDir>
#include <QTest>

#include <hdf5.h>

using namespace kvscope;
using namespace kvtest;

namespace {

const std::string kAttention = "layers.0.self_attn";
const std::string kMixer = "layers.1.mixer";

KvCacheConfig hybridConfig()
{
    return KvCacheConfig::fromJson(configJson(4, 2, 2, 3, {{{kAttention}, "FullAttentionSpec", 4},
                                                           {{kMixer}, "MambaSpec", 4}}));
}

// Value i of a whole part: distinct, exactly representable in bf16 (small integers over 8).
float wholeValue(int side, std::int64_t i)
{
    return float((i * 7 + side * 3) % 61 - 30) / 8.0f;
}

// A whole part [checkpoints, units, width] of `side` (0 expected, 1 baseline).
RawTensor wholePart(DType dtype, std::int64_t checkpoints, std::int64_t units, std::int64_t width, int side)
{
    std::vector<float> values(std::size_t(checkpoints * units * width));
    for (std::size_t i = 0; i < values.size(); ++i)
        values[i] = wholeValue(side, std::int64_t(i));
    return RawTensor::fromFloat(dtype, {checkpoints, units, width}, values);
}

// The rows `units` of a whole part, as a rank holds them.
StatePart rankPart(const std::string& name, const RawTensor& whole, const std::vector<std::int64_t>& units)
{
    const std::vector<float> all = whole.toFloat();
    const std::int64_t checkpoints = whole.shape[0], wholeUnits = whole.shape[1], width = whole.shape[2];
    std::vector<float> mine;
    for (std::int64_t c = 0; c < checkpoints; ++c)
        for (std::int64_t u : units)
            for (std::int64_t w = 0; w < width; ++w)
                mine.push_back(all[std::size_t((c * wholeUnits + u) * width + w)]);
    return {name, RawTensor::fromFloat(whole.dtype, {checkpoints, std::int64_t(units.size()), width}, mine), units};
}

struct Sides {
    LayerStateRecord engine, expected, baseline;
};

// Mamba2 over TP 2 with one B/C group: conv channels x0 x1 | x2 x3 split, B and C (4, 5) on
// both ranks; ssm heads 0-1 and 2-3. The engine's checkpoints are 4, 8, 9; the references' 4, 8.
Sides mambaSides()
{
    Sides s;
    const RawTensor conv = wholePart(DType::BFloat16, 3, 6, 3, 0), ssm = wholePart(DType::Float32, 3, 4, 2, 0);
    s.engine = {kMixer, "mamba2", {4, 8, 9}, {}};
    s.engine.ranks = {{rankPart("conv", conv, {0, 1, 4, 5}), rankPart("ssm", ssm, {0, 1})},
                      {rankPart("conv", conv, {2, 3, 4, 5}), rankPart("ssm", ssm, {2, 3})}};
    s.expected = {kMixer, "", {4, 8}, {{{"conv", wholePart(DType::BFloat16, 2, 6, 3, 0), {}},
                                        {"ssm", wholePart(DType::Float32, 2, 4, 2, 0), {}}}}};
    s.baseline = {kMixer, "", {4, 8}, {{{"conv", wholePart(DType::Float32, 2, 6, 3, 1), {}},
                                        {"ssm", wholePart(DType::Float32, 2, 4, 2, 1), {}}}}};
    return s;
}

// A bundle of one prompt (10 positions) with the attention layer and, unless `states` is empty,
// the mixer's state sides given.
void writeHybrid(const QString& path, const Sides* states)
{
    BundleWriter writer(path.toStdString(), BundleMetadata{"hybrid", "test", "2026-12-06T00:00:00Z", "", {}, {}, 2},
                        hybridConfig());
    writer.addPrompt({"p0", {1, 2, 3, 4, 5, 6, 7, 8, 9, 10}, {}, std::nullopt, {}, {}});
    EngineSnapshot snap;
    snap.seqLens = {10};
    snap.blockTables = {table({{0, 1, 2}}, 3), table({{3}}, 1)};
    snap.ranks.resize(2);
    for (auto& rank : snap.ranks)
        rank[kAttention] = {wholePart(DType::Float32, 4, 1, 12, 0), wholePart(DType::Float32, 4, 1, 12, 0)};
    for (auto& rank : snap.ranks)
        for (RawTensor* t : {&rank[kAttention].first, &rank[kAttention].second})
            t->shape = {4, 1, 4, 3};
    writer.addSnapshot("p0", snap);
    RawTensor k = wholePart(DType::Float32, 1, 2, 30, 0);
    k.shape = {1, 2, 10, 3};
    writer.addReference("p0", ReferenceRole::Expected, kAttention, k, k);
    if (states) {
        writer.addEngineState("p0", states->engine);
        writer.addReferenceState("p0", ReferenceRole::Expected, states->expected);
        writer.addReferenceState("p0", ReferenceRole::Baseline, states->baseline);
    }
    writer.finish();
}

}  // namespace

class TestLayerState : public QObject {
    Q_OBJECT
private slots:
    void roundTripMergesRanksByUnits();
    void replicaThatDiffersIsNamed();
    void writerRefusesBadStates();
    void readerNamesBadStates();
};

void TestLayerState::roundTripMergesRanksByUnits()
{
    QTemporaryDir dir;
    const QString path = dir.filePath("hybrid.h5");
    const Sides sides = mambaSides();
    writeHybrid(path, &sides);
    BundleReader reader(path.toStdString());
    QCOMPARE(reader.prompt("p0").stateLayers, std::vector<std::string>{kMixer});
    QVERIFY(reader.prompt("p0").problems.empty());
    const LayerState state = loadLayerState(reader, "p0", kMixer);
    QCOMPARE(state.kind, std::string("mamba2"));
    QCOMPARE(state.positions, (std::vector<std::int64_t>{4, 8}));
    QCOMPARE(state.uncompared, std::vector<std::int64_t>{9});
    QVERIFY(state.hasBaseline);
    QVERIFY(state.replicaDifferences.empty());
    QCOMPARE(state.parts.size(), std::size_t(2));
    for (const StatePartValues& part : state.parts) {
        const bool conv = part.name == "conv";
        QCOMPARE(part.shape, (std::vector<std::int64_t>{2, conv ? 6 : 4, conv ? 3 : 2}));
        QCOMPARE(part.engineDType, conv ? DType::BFloat16 : DType::Float32);
        // Merged: the engine's whole state at the compared checkpoints is the test's own values.
        for (std::size_t i = 0; i < part.engine.size(); ++i) {
            QCOMPARE(part.engine[i], wholeValue(0, std::int64_t(i)));
            QCOMPARE(part.expected[i], wholeValue(0, std::int64_t(i)));
            QCOMPARE(part.baseline[i], wholeValue(1, std::int64_t(i)));
        }
    }
}

void TestLayerState::replicaThatDiffersIsNamed()
{
    QTemporaryDir dir;
    const QString path = dir.filePath("replica.h5");
    Sides sides = mambaSides();
    // Rank 1's copy of C (unit 5) at the second checkpoint (position 8): one bf16 value changed.
    RawTensor& conv = sides.engine.ranks[1][0].tensor;
    const std::size_t element = std::size_t((1 * 4 + 3) * 3 + 1);
    std::vector<float> values = conv.toFloat();
    values[element] += 1.0f;
    conv = RawTensor::fromFloat(DType::BFloat16, conv.shape, values);
    writeHybrid(path, &sides);
    BundleReader reader(path.toStdString());
    const LayerState state = loadLayerState(reader, "p0", kMixer);
    QCOMPARE(state.replicaDifferences.size(), std::size_t(1));
    const StateReplicaDifference& d = state.replicaDifferences[0];
    QCOMPARE(d.rank, 1);
    QCOMPARE(d.againstRank, 0);
    QCOMPARE(d.part, std::string("conv"));
    QCOMPARE(d.unit, std::int64_t(5));
    QCOMPARE(d.position, std::int64_t(8));
    QCOMPARE(d.units, 1);
    // The copy read (rank 0's) is the state compared: the engine's equals the expected everywhere.
    QCOMPARE(state.parts[0].engine, state.parts[0].expected);
}

void TestLayerState::writerRefusesBadStates()
{
    QTemporaryDir dir;
    auto refused = [&](const std::function<void(Sides&)>& damage, const std::vector<std::string>& parts) {
        Sides sides = mambaSides();
        damage(sides);
        expectBundleError([&] { writeHybrid(dir.filePath("bad.h5"), &sides); }, parts);
    };
    const std::string engine = "/prompts/p0/engine/states/" + kMixer;
    const std::string expected = "/prompts/p0/reference/expected/states/" + kMixer;
    refused([](Sides& s) { s.engine.positions = {4, 4, 9}; }, {engine, "positions must increase", "checkpoint 1"});
    refused([](Sides& s) { s.engine.ranks[1].pop_back(); }, {engine, "rank 1", "1 parts, rank 0 has 2"});
    refused([](Sides& s) { s.engine.ranks[1][1].units = {2, 7}; }, {expected, "rank 1", "'ssm'", "unit 7", "outside"});
    refused([](Sides& s) { s.engine.ranks[1][1].units = {1, 3}; }, {expected, "'ssm'", "unit 2 is held by no rank"});
    refused([](Sides& s) { s.engine.layer = kAttention; }, {"is in no MambaSpec group"});
    refused([](Sides& s) { s.expected.ranks[0][1].tensor = wholePart(DType::Float32, 2, 4, 5, 0); },
            {expected, "'ssm'", "differ past the units"});
    refused([](Sides& s) { s.engine.ranks[0][0].tensor = wholePart(DType::Int8, 3, 4, 3, 0); },
            {engine, "rank 0, part 'conv'", "dtype int8"});
    refused([](Sides& s) { s.engine.ranks[0][1].units = {0}; }, {engine, "1 units listed for 2 rows"});
    // The expected reference's state is required beside the engine's.
    Sides sides = mambaSides();
    expectBundleError([&] {
        BundleWriter writer(dir.filePath("noref.h5").toStdString(), BundleMetadata{}, hybridConfig());
        writer.addPrompt({"p0", {1, 2}, {}, std::nullopt, {}, {}});
        writer.addEngineState("p0", sides.engine);
        writer.finish();
    }, {"/prompts/p0/reference/expected/states/" + kMixer, "missing: the engine's state of this layer needs the expected"});
}

void TestLayerState::readerNamesBadStates()
{
    QTemporaryDir dir;
    const QString path = dir.filePath("hybrid.h5");
    const Sides sides = mambaSides();
    const std::string engine = "/prompts/p0/engine/states/" + kMixer;
    auto broken = [&](const std::function<void(hid_t)>& damage, const std::vector<std::string>& parts) {
        writeHybrid(path, &sides);
        modify(path, damage);
        BundleReader reader(path.toStdString());
        expectBundleError([&] { loadLayerState(reader, "p0", kMixer); }, parts);
    };
    broken([&](hid_t f) { H5Ldelete(f, (engine + "/rank_1/ssm_units").c_str(), H5P_DEFAULT); },
           {path.toStdString(), engine + "/rank_1/ssm_units", "missing"});
    broken([&](hid_t f) { H5Ldelete(f, (engine + "/rank_1").c_str(), H5P_DEFAULT); },
           {engine + "/rank_1", "missing: tp_size is 2"});
    broken([&](hid_t f) { H5Ldelete(f, "/prompts/p0/reference/expected/states", H5P_DEFAULT); },
           {"/prompts/p0/reference/expected/states/" + kMixer, "missing"});
    broken([&](hid_t f) {  // a state in int8 codes
        const hid_t d = H5Dopen2(f, (engine + "/rank_0/ssm").c_str(), H5P_DEFAULT);
        H5Adelete(d, "dtype");
        const hid_t type = H5Tcopy(H5T_C_S1);
        H5Tset_size(type, 4);
        const hid_t space = H5Screate(H5S_SCALAR);
        const hid_t a = H5Acreate2(d, "dtype", type, space, H5P_DEFAULT, H5P_DEFAULT);
        H5Awrite(a, type, "int8");
        H5Aclose(a);
        H5Sclose(space);
        H5Tclose(type);
        H5Dclose(d);
    }, {engine + "/rank_0/ssm", "cannot hold int8"});
    // A bundle without states has none, and its attention layers are untouched.
    writeHybrid(path, nullptr);
    BundleReader plain(path.toStdString());
    QVERIFY(plain.prompt("p0").stateLayers.empty());
    QVERIFY(plain.prompt("p0").problems.empty());
}

QTEST_GUILESS_MAIN(TestLayerState)
#include "tst_layer_state.moc"
