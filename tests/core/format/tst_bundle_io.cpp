// Capture bundles: writer -> reader round trips (bit-exact for every dtype), lazy reads,
// and bad input, each of which must give an error naming the file, the object and the problem.

#include "format/bundle_reader.h"
#include "format/bundle_writer.h"
#include "format/fletcher32.h"
#include "util/version.h"
#include "kv/capture_loader.h"
#include "modify_bundle.h"
#include "test_support.h"

#include <QCryptographicHash>
#include <QElapsedTimer>
#include <QFile>
#include <QFileInfo>
#include <QTemporaryDir>
#include <QTest>

#include <hdf5.h>

#include <csignal>
#include <random>

#include <unistd.h>

using namespace kvscope;
using namespace kvtest;

namespace {

const std::vector<std::string> kLayers{"layers.0.self_attn", "layers.1.self_attn", "layers.2.self_attn"};

// Two groups (full attention, block 4; sliding window 6, block 2), 4 heads over TP 2, head_size 3.
KvCacheConfig smallConfig(const std::string& dtype)
{
    return KvCacheConfig::fromJson(configJson(24, 2, 4, 3,
        {{{kLayers[0], kLayers[2]}, "FullAttentionSpec", 4},
         {{kLayers[1]}, "SlidingWindowSpec", 2, 6}}, dtype));
}

// Random bit patterns: every representable value, NaNs included, must survive bit-exactly.
// With `granularity` Head or TokenHead (an engine cache), random positive scales of that
// granularity instead of `scale`.
RawTensor randomTensor(DType dtype, std::vector<std::int64_t> shape, std::mt19937& rng, float scale = 1.0f,
                       ScaleGranularity granularity = ScaleGranularity::Tensor)
{
    RawTensor t;
    t.dtype = dtype;
    t.shape = std::move(shape);
    t.scale = scale;
    t.bytes.resize(std::size_t(t.numel()) * dtypeSize(dtype));
    for (auto& b : t.bytes)
        b = std::uint8_t(rng());
    if (granularity != ScaleGranularity::Tensor) {
        const std::int64_t count = granularity == ScaleGranularity::Head ? t.shape[1] : t.shape[0] * t.shape[1] * t.shape[2];
        std::vector<float> scales;
        for (std::int64_t i = 0; i < count; ++i)
            scales.push_back(std::ldexp(1.0f + float(rng() % 1000) / 1000.0f, int(rng() % 9) - 6));
        t.setScales(granularity, std::move(scales));
    }
    return t;
}

struct Written {
    KvCacheConfig config;
    EngineSnapshot snapshot;
    std::map<std::string, std::pair<RawTensor, RawTensor>> expected;
    Logits logits;
};

Written writeBundle(const QString& path, DType dtype, bool keepOnlyReferenced, float scale = 1.0f,
                    ScaleGranularity granularity = ScaleGranularity::Tensor)
{
    std::mt19937 rng(42);
    Written w{smallConfig("torch." + dtypeName(dtype)), {}, {}, {}};
    BundleMetadata meta{"tiny-model", "test-engine", "2026-11-30T00:00:00Z", "round trip", {{"fault", "none"}}, {}, kBundleFormatVersion};
    BundleWriter writer(path.toStdString(), meta, w.config);
    PromptRecord prompt{"p0", {5, 6, 7, 8, 9}, {1, 2, 3, 4, 5}, std::vector<std::int64_t>{7}, {}};
    for (int i = 0; i < 10; ++i)
        prompt.tokenStrings.push_back("tok" + std::to_string(i) + (i == 3 ? " é" : ""));
    writer.addPrompt(prompt);

    EngineSnapshot& s = w.snapshot;
    s.seqLens = {10, 4};
    s.batchRow = 0;
    s.validatedUntil = 9;
    s.blockTables = {table({{17, 3, 11, -1}, {5, -1}}, 4), table({{-1, -1, 20, 8, 14, -1}, {2, 9}}, 6)};
    s.keepOnlyReferencedBlocks = keepOnlyReferenced;
    s.ranks.resize(2);
    for (int r = 0; r < 2; ++r)
        for (std::size_t l = 0; l < kLayers.size(); ++l) {
            const int bs = l == 1 ? 2 : 4;
            s.ranks[std::size_t(r)][kLayers[l]] = {randomTensor(dtype, {24, 2, bs, 3}, rng, scale, granularity),
                                                   randomTensor(dtype, {24, 2, bs, 3}, rng, scale, granularity)};
        }
    writer.addSnapshot("p0", s);
    for (const std::string& layer : kLayers) {
        const std::int64_t seq = layer == kLayers[1] ? 5 : 10;
        w.expected[layer] = {randomTensor(dtype, {1, 4, seq, 3}, rng, scale), randomTensor(dtype, {1, 4, seq, 3}, rng, scale)};
        writer.addReference("p0", ReferenceRole::Expected, layer, w.expected[layer].first, w.expected[layer].second);
    }
    w.logits.steps = 5;
    w.logits.vocab = 11;
    for (int i = 0; i < 55; ++i)
        w.logits.values.push_back(float(i) * 0.25f - 3.0f);
    writer.addLogits("p0", LogitsRole::Actual, w.logits);
    writer.finish();
    return w;
}

// A dataset stored as format v2 stores every one: in chunks (here one) with a Fletcher32 checksum.
hid_t createChecksummed(hid_t file, const char* path, hid_t type, const std::vector<hsize_t>& dims,
                        std::vector<hsize_t> chunk = {})
{
    const hid_t space = H5Screate_simple(int(dims.size()), dims.data(), nullptr);
    const hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
    if (chunk.empty())
        chunk = dims;
    H5Pset_chunk(dcpl, int(chunk.size()), chunk.data());
    H5Pset_fletcher32(dcpl);
    const hid_t d = H5Dcreate2(file, path, type, space, H5P_DEFAULT, dcpl, H5P_DEFAULT);
    H5Pclose(dcpl);
    H5Sclose(space);
    return d;
}

void replaceWithFloats(hid_t file, const char* path, std::vector<hsize_t> dims)
{
    H5Ldelete(file, path, H5P_DEFAULT);
    const hid_t d = createChecksummed(file, path, H5T_IEEE_F32LE, dims, std::vector<hsize_t>(dims.size(), 1));
    const hid_t str = H5Tcopy(H5T_C_S1);
    H5Tset_size(str, 8);
    const hid_t aspace = H5Screate(H5S_SCALAR);
    const hid_t a = H5Acreate2(d, "dtype", str, aspace, H5P_DEFAULT, H5P_DEFAULT);
    H5Awrite(a, str, "float32\0");
    H5Aclose(a);
    H5Sclose(aspace);
    H5Tclose(str);
    H5Dclose(d);
}

void replaceConfig(hid_t file, const std::string& text)
{
    H5Ldelete(file, "/kv_cache_config", H5P_DEFAULT);
    const hid_t str = H5Tcopy(H5T_C_S1);  // format v2: one fixed-length string, checksummed
    H5Tset_size(str, text.size());
    const hid_t d = createChecksummed(file, "/kv_cache_config", str, {1});
    H5Dwrite(d, str, H5S_ALL, H5S_ALL, H5P_DEFAULT, text.data());
    H5Dclose(d);
    H5Tclose(str);
}

QByteArray fileHash(const QString& path)
{
    QFile f(path);
    f.open(QIODevice::ReadOnly);
    return QCryptographicHash::hash(f.readAll(), QCryptographicHash::Sha256);
}

}  // namespace

class TestBundleIo : public QObject {
    Q_OBJECT

private slots:
    void roundTrip_data();
    void roundTrip();
    void keepsOnlyReferencedBlocks();
    void loaderReconstructsFromBundle();
    void noReferencedBlockAtAll();
    void partialEdgeChunksAreData();
    void readingNeverModifiesTheFile();
    void badInput_data();
    void badInput();
    void writerRefusesInconsistentInput();
    void messagesEscapeFileText();
    void writesFormatV2();
    void fletcher32IsHdf5s_data();
    void fletcher32IsHdf5s();
    void flippedBitIsAnError_data();
    void flippedBitIsAnError();
    void probeStopsACrashOrAHang();

private:
    QTemporaryDir m_dir;
};

void TestBundleIo::roundTrip_data()
{
    QTest::addColumn<int>("dtype");
    QTest::addColumn<float>("scale");
    QTest::addColumn<int>("granularity");
    const int tensor = int(ScaleGranularity::Tensor), head = int(ScaleGranularity::Head),
              tokenHead = int(ScaleGranularity::TokenHead);
    QTest::newRow("bfloat16") << int(DType::BFloat16) << 1.0f << tensor;
    QTest::newRow("float16") << int(DType::Float16) << 1.0f << tensor;
    QTest::newRow("float32") << int(DType::Float32) << 1.0f << tensor;
    QTest::newRow("float8_e4m3fn with scale") << int(DType::Float8E4M3) << 0.0625f << tensor;
    QTest::newRow("float8_e5m2 with scale") << int(DType::Float8E5M2) << 3.5f << tensor;
    QTest::newRow("float8_e4m3fn per head") << int(DType::Float8E4M3) << 1.0f << head;
    QTest::newRow("float8_e4m3fn per token and head") << int(DType::Float8E4M3) << 1.0f << tokenHead;
    QTest::newRow("float8_e4m3fnuz per head") << int(DType::Float8E4M3Fnuz) << 1.0f << head;
    QTest::newRow("int8 per token and head") << int(DType::Int8) << 1.0f << tokenHead;
}

void TestBundleIo::roundTrip()
{
    QFETCH(int, dtype);
    QFETCH(float, scale);
    QFETCH(int, granularity);
    const QString path = m_dir.filePath(QString("rt_%1_%2.h5").arg(dtype).arg(granularity));
    const Written w = writeBundle(path, DType(dtype), false, scale, ScaleGranularity(granularity));
    QVERIFY(!QFileInfo::exists(path + ".partial"));

    const BundleReader reader(path.toStdString());
    QCOMPARE(reader.metadata().model, std::string("tiny-model"));
    QCOMPARE(reader.metadata().engine, std::string("test-engine"));
    QCOMPARE(reader.metadata().created, std::string("2026-11-30T00:00:00Z"));
    QCOMPARE(reader.metadata().notes, std::string("round trip"));
    QCOMPARE(reader.metadata().writer, std::string("kvscope ") + kVersion);
    QCOMPARE(reader.metadata().extra, (std::map<std::string, std::string>{{"fault", "none"}}));
    QCOMPARE(reader.config().toJson(), w.config.toJson());
    QCOMPARE(reader.prompts().size(), std::size_t(1));
    const PromptInfo& p = reader.prompt("p0");
    QVERIFY(p.problems.empty());
    QCOMPARE(p.promptLen, std::int64_t(5));
    QCOMPARE(p.inputIds, (std::vector<std::int64_t>{5, 6, 7, 8, 9}));
    QCOMPARE(p.teacherTokens, (std::vector<std::int64_t>{1, 2, 3, 4, 5}));
    QVERIFY(p.hasDivergences);
    QCOMPARE(p.divergencePositions, (std::vector<std::int64_t>{7}));
    QCOMPARE(p.tokenStrings.size(), std::size_t(10));
    QCOMPARE(p.tokenStrings[3], std::string("tok3 é"));
    QVERIFY(p.hasExpected);
    QVERIFY(!p.hasBaseline);
    QCOMPARE(p.logits, (std::vector<LogitsRole>{LogitsRole::Actual}));
    QCOMPARE(p.snapshots.size(), std::size_t(1));
    QCOMPARE(p.snapshots[0].seqLens, (std::vector<std::int64_t>{10, 4}));
    QCOMPARE(p.snapshots[0].validatedUntil, std::int64_t(9));
    QVERIFY(p.snapshots[0].storedBlockIds.empty());

    for (std::size_t g = 0; g < 2; ++g) {
        const BlockTable t = reader.readBlockTable("p0", 0, g);
        QCOMPARE(t.rows, w.snapshot.blockTables[g].rows);
        QCOMPARE(t.cols, w.snapshot.blockTables[g].cols);
        QCOMPARE(t.entries, w.snapshot.blockTables[g].entries);
    }
    for (int r = 0; r < 2; ++r)
        for (const std::string& layer : kLayers) {
            const PagedShard k = reader.readEngineShard("p0", 0, r, layer, KvPart::K);
            const PagedShard v = reader.readEngineShard("p0", 0, r, layer, KvPart::V);
            const auto& in = w.snapshot.ranks[std::size_t(r)].at(layer);
            QCOMPARE(k.blocks.dtype, DType(dtype));
            QCOMPARE(k.blocks.shape, in.first.shape);
            QVERIFY(k.blocks.bytes == in.first.bytes);
            QVERIFY(v.blocks.bytes == in.second.bytes);
            QCOMPARE(k.blocks.scale, scale);
            QCOMPARE(k.blocks.granularity(), ScaleGranularity(granularity));
            QCOMPARE(k.blocks.scales, in.first.scales);
            QCOMPARE(v.blocks.scales, in.second.scales);
            QCOMPARE(k.physicalIds.size(), std::size_t(24));
            // Decoded with its own scales and encoded again, every finite value gives its byte back.
            const std::vector<float> decoded = k.blocks.toFloat();
            const std::size_t width = dtypeSize(DType(dtype));
            for (std::int64_t e = 0; e < k.blocks.numel(); ++e) {
                if (!std::isfinite(decoded[std::size_t(e)]))
                    continue;  // NaN payloads and e5m2's infinities, which no saturating engine writes
                std::uint8_t again[4];
                encodeFromFloat(DType(dtype), &decoded[std::size_t(e)], 1, again, k.blocks.scaleAt(e));
                QVERIFY(std::equal(again, again + width, k.blocks.bytes.begin() + std::ptrdiff_t(std::size_t(e) * width)));
            }
            // Lazy read of a few blocks, asked out of order: each row is the block it claims.
            const std::vector<std::int64_t> ids{11, 3, 17};
            const PagedShard some = reader.readEngineShard("p0", 0, r, layer, KvPart::K, &ids);
            QCOMPARE(some.physicalIds, (std::vector<std::int64_t>{3, 11, 17}));
            const std::size_t rowBytes = std::size_t(in.first.stride(0)) * dtypeSize(DType(dtype));
            const std::int64_t rowScales = in.first.shape[1] * in.first.shape[2];
            for (std::size_t i = 0; i < 3 && granularity == int(ScaleGranularity::TokenHead); ++i)
                QVERIFY(std::equal(some.blocks.scales.begin() + std::ptrdiff_t(i) * rowScales,
                                   some.blocks.scales.begin() + std::ptrdiff_t(i + 1) * rowScales,
                                   in.first.scales.begin() + some.physicalIds[i] * rowScales));
            for (std::size_t i = 0; i < 3; ++i)
                QVERIFY(std::equal(some.blocks.bytes.begin() + std::ptrdiff_t(i * rowBytes),
                                   some.blocks.bytes.begin() + std::ptrdiff_t((i + 1) * rowBytes),
                                   in.first.bytes.begin() + std::ptrdiff_t(std::size_t(some.physicalIds[i]) * rowBytes)));
        }
    for (const std::string& layer : kLayers) {
        const BundleReader::Reference ref = reader.readReference("p0", ReferenceRole::Expected, layer);
        QCOMPARE(ref.k.shape, w.expected.at(layer).first.shape);
        QVERIFY(ref.k.bytes == w.expected.at(layer).first.bytes);
        QVERIFY(ref.v.bytes == w.expected.at(layer).second.bytes);
        QCOMPARE(ref.batchRow, std::int64_t(0));
    }
    const Logits logits = reader.readLogits("p0", LogitsRole::Actual);
    QCOMPARE(logits.steps, std::int64_t(5));
    QCOMPARE(logits.vocab, std::int64_t(11));
    QCOMPARE(logits.values, w.logits.values);
    QVERIFY(reader.validate().empty());
}

void TestBundleIo::keepsOnlyReferencedBlocks()
{
    const QString path = m_dir.filePath("subset.h5");
    const Written w = writeBundle(path, DType::BFloat16, true);
    const BundleReader reader(path.toStdString());
    const std::vector<std::int64_t> referenced{2, 3, 5, 8, 9, 11, 14, 17, 20};
    QCOMPARE(reader.prompt("p0").snapshots[0].storedBlockIds, referenced);
    const PagedShard k = reader.readEngineShard("p0", 0, 1, kLayers[0], KvPart::K);
    QCOMPARE(k.physicalIds, referenced);
    QCOMPARE(k.blocks.shape[0], std::int64_t(referenced.size()));
    const RawTensor& all = w.snapshot.ranks[1].at(kLayers[0]).first;
    const std::size_t rowBytes = std::size_t(all.stride(0)) * 2;
    for (std::size_t i = 0; i < referenced.size(); ++i)
        QVERIFY(std::equal(k.blocks.bytes.begin() + std::ptrdiff_t(i * rowBytes),
                           k.blocks.bytes.begin() + std::ptrdiff_t((i + 1) * rowBytes),
                           all.bytes.begin() + std::ptrdiff_t(std::size_t(referenced[i]) * rowBytes)));
    // A block that is not stored is left out of a lazy read (reconstruction reports it).
    const std::vector<std::int64_t> ids{4, 9};
    QCOMPARE(reader.readEngineShard("p0", 0, 1, kLayers[0], KvPart::K, &ids).physicalIds, (std::vector<std::int64_t>{9}));
    QVERIFY(reader.validate().empty());
}

void TestBundleIo::loaderReconstructsFromBundle()
{
    // A bundle whose engine blocks are laid out by hand from the formula: the loader must
    // give back the formula at every held position, for both groups, through the file.
    const QString path = m_dir.filePath("formula.h5");
    const KvCacheConfig cfg = smallConfig("torch.float32");
    const std::vector<std::vector<std::int32_t>> rows0{{17, 3, 11}}, rows1{{-1, -1, 20, 8, 14}};
    {
        BundleWriter writer(path.toStdString(), {}, cfg);
        writer.addPrompt({"p0", {1, 2, 3, 4, 5, 6}, {7, 8, 9, 10}, std::nullopt, {}});
        EngineSnapshot s;
        s.seqLens = {11};  // 10 positions written
        s.blockTables = {table(rows0, 3), table(rows1, 5)};
        s.ranks.resize(2);
        s.keepOnlyReferencedBlocks = true;
        for (std::size_t l = 0; l < 3; ++l) {
            const int g = l == 1 ? 1 : 0;
            const LayerShards sh = handPagedLayer(cfg, g, int(l), g ? rows1 : rows0, {10});
            for (int r = 0; r < 2; ++r)
                s.ranks[std::size_t(r)][kLayers[l]] = {sh.k[std::size_t(r)].blocks, sh.v[std::size_t(r)].blocks};
        }
        writer.addSnapshot("p0", s);
        for (std::size_t l = 0; l < 3; ++l) {
            const std::int64_t seq = l == 1 ? 5 : 11;  // HF keeps window - 1 = 5 positions
            std::vector<float> k, v;
            for (int h = 0; h < 4; ++h)
                for (std::int64_t p = 11 - seq; p < 11; ++p)
                    for (int d = 0; d < 3; ++d) {
                        k.push_back(trueValue(int(l), h, p, d, KvPart::K));
                        v.push_back(trueValue(int(l), h, p, d, KvPart::V));
                    }
            writer.addReference("p0", ReferenceRole::Expected, kLayers[l], RawTensor::fromFloat(DType::Float32, {1, 4, seq, 3}, k),
                                RawTensor::fromFloat(DType::Float32, {1, 4, seq, 3}, v));
        }
        writer.finish();
    }
    const CaptureLoader loader(std::make_shared<BundleReader>(path.toStdString()));
    QCOMPARE(loader.sequenceLength("p0"), std::int64_t(11));
    std::vector<bool> full(11, true), sliding(11, false);
    full[10] = false;  // the last sampled token is never written
    for (int p = 5; p < 10; ++p)
        sliding[std::size_t(p)] = true;  // window 6 at 10 written: positions 5..9
    verifyLayer(loader.engineLayer("p0", kLayers[0]), 0, full);
    verifyLayer(loader.engineLayer("p0", kLayers[1]), 1, sliding);
    verifyLayer(loader.engineLayer("p0", kLayers[2]), 2, full);
    std::vector<bool> refSliding(11, false);
    for (int p = 6; p < 11; ++p)
        refSliding[std::size_t(p)] = true;
    verifyLayer(loader.referenceLayer("p0", ReferenceRole::Expected, kLayers[0]), 0, std::vector<bool>(11, true));
    verifyLayer(loader.referenceLayer("p0", ReferenceRole::Expected, kLayers[1]), 1, refSliding);

    // Layout only (kvscope inspect): the same positions held, from the tables, the stored ids and
    // the references' shapes; no value read.
    CaptureLoader layout(std::make_shared<BundleReader>(path.toStdString()));
    layout.setValueRead(ValueRead::LayoutOnly);
    const auto held = [](const LayerSource& s) { return std::vector<bool>(s.present.begin(), s.present.end()); };
    const LayerSource engine = layout.engineSource("p0", kLayers[0]);
    QCOMPARE(held(engine), full);
    QVERIFY(engine.runs(KvPart::K, 0)[0].tensor->bytes.empty());
    QCOMPARE(held(layout.engineSource("p0", kLayers[1])), sliding);
    const LayerSource reference = layout.referenceSource("p0", ReferenceRole::Expected, kLayers[1]);
    QCOMPARE(held(reference), refSliding);
    QVERIFY(reference.runs(KvPart::V, 6)[0].tensor->bytes.empty());
    std::vector<bool> window(11, false);
    for (int p = 2; p < 5; ++p)
        window[std::size_t(p)] = true;
    QCOMPARE(held(layout.referenceSource("p0", ReferenceRole::Expected, kLayers[0], {2, 5})), window);
}

void TestBundleIo::noReferencedBlockAtAll()
{
    // Every table entry null: "keep only referenced blocks" keeps none, and says so.
    const QString path = m_dir.filePath("none-referenced.h5");
    const KvCacheConfig cfg = smallConfig("torch.float32");
    {
        BundleWriter writer(path.toStdString(), {}, cfg);
        writer.addPrompt({"p0", {1}, {}, std::nullopt, {}});
        EngineSnapshot s;
        s.seqLens = {1};  // nothing written yet
        s.blockTables = {table({{-1, -1}}, 2), table({{-1}}, 1)};
        s.keepOnlyReferencedBlocks = true;
        s.ranks.resize(2);
        for (int r = 0; r < 2; ++r)
            for (std::size_t l = 0; l < 3; ++l) {
                const std::vector<std::int64_t> shape{24, 2, l == 1 ? 2 : 4, 3};
                const std::vector<float> zeros(std::size_t(24 * 2 * shape[2] * 3), 0.0f);
                s.ranks[std::size_t(r)][kLayers[l]] = {RawTensor::fromFloat(DType::Float32, shape, zeros),
                                                       RawTensor::fromFloat(DType::Float32, shape, zeros)};
            }
        writer.addSnapshot("p0", s);
        for (const std::string& layer : kLayers)
            writer.addReference("p0", ReferenceRole::Expected, layer, RawTensor::fromFloat(DType::Float32, {1, 4, 1, 3}, std::vector<float>(12)),
                                RawTensor::fromFloat(DType::Float32, {1, 4, 1, 3}, std::vector<float>(12)));
        writer.finish();
    }
    const auto reader = std::make_shared<BundleReader>(path.toStdString());
    QVERIFY(reader->prompt("p0").snapshots[0].subsetStored);
    QVERIFY(reader->prompt("p0").snapshots[0].storedBlockIds.empty());
    QVERIFY(reader->validate().empty());
    const LayerKv kv = CaptureLoader(reader).engineLayer("p0", kLayers[0]);
    QCOMPARE(kv.seq, std::int64_t(1));
    QCOMPARE(kv.presentCount(), std::int64_t(0));  // the only position is the unwritten last one
}

void TestBundleIo::partialEdgeChunksAreData()
{
    // 16 KiB blocks are chunked 4 to a chunk: 10 blocks leave an edge chunk half outside the
    // extent, which HDF5 reports as "partly allocated" although every block was written.
    const QString path = m_dir.filePath("edge-chunks.h5");
    const KvCacheConfig cfg = KvCacheConfig::fromJson(configJson(10, 1, 1, 512, {{{"l0"}, "FullAttentionSpec", 16}}, "torch.bfloat16"));
    std::mt19937 rng(9);
    const RawTensor k = randomTensor(DType::BFloat16, {10, 1, 16, 512}, rng), v = randomTensor(DType::BFloat16, {10, 1, 16, 512}, rng);
    {
        BundleWriter writer(path.toStdString(), {}, cfg);
        writer.addPrompt({"p0", {1}, {}, std::nullopt, {}});
        EngineSnapshot s;
        s.seqLens = {2};
        s.blockTables = {table({{3}}, 1)};
        s.ranks = {{{"l0", {k, v}}}};
        writer.addSnapshot("p0", s);
        writer.addReference("p0", ReferenceRole::Expected, "l0", RawTensor::fromFloat(DType::Float32, {1, 1, 2, 512}, std::vector<float>(1024)),
                            RawTensor::fromFloat(DType::Float32, {1, 1, 2, 512}, std::vector<float>(1024)));
        writer.finish();
    }
    const BundleReader reader(path.toStdString());
    QVERIFY(reader.validate().empty());
    QVERIFY(reader.readEngineShard("p0", 0, 0, "l0", KvPart::K).blocks.bytes == k.bytes);
    const std::vector<std::int64_t> ids{9};
    QCOMPARE(reader.readEngineShard("p0", 0, 0, "l0", KvPart::V, &ids).blocks.bytes.size(), std::size_t(16 * 512 * 2));
}

void TestBundleIo::readingNeverModifiesTheFile()
{
    const QString path = m_dir.filePath("ro.h5");
    writeBundle(path, DType::Float16, false);
    QFile::setPermissions(path, QFileDevice::ReadOwner | QFileDevice::ReadGroup);
    const QByteArray before = fileHash(path);
    const QDateTime mtime = QFileInfo(path).lastModified();
    {
        const auto reader = std::make_shared<BundleReader>(path.toStdString());
        const CaptureLoader loader(reader);
        loader.engineLayer("p0", kLayers[0]);
        reader->validate();
    }
    QCOMPARE(fileHash(path), before);
    QCOMPARE(QFileInfo(path).lastModified(), mtime);
}

void TestBundleIo::badInput_data()
{
    QTest::addColumn<QString>("damage");
    QTest::addColumn<QString>("object");
    QTest::addColumn<QString>("problem");
    QTest::newRow("missing file") << "missing" << "" << "cannot open";
    QTest::newRow("not HDF5") << "text" << "" << "not an HDF5 file";
    QTest::newRow("truncated") << "truncate" << "" << "";
    QTest::newRow("not a bundle") << "format" << "/" << "format is 'something-else'";
    QTest::newRow("future version") << "version" << "/" << "format_version 3 is not supported";
    QTest::newRow("config not JSON") << "config-text" << "/kv_cache_config" << "not valid JSON";
    QTest::newRow("config missing field") << "config-field" << "/kv_cache_config.num_blocks" << "missing";
    QTest::newRow("config disagrees with tensors") << "config-head-size"
        << "/prompts/p0/engine/snapshot_0/rank_0/layers.0.self_attn/k" << "shape [24, 2, 4, 3], expected [24, 2, 4, 5]";
    QTest::newRow("missing dataset") << "delete-k" << "/prompts/p0/engine/snapshot_0/rank_1/layers.2.self_attn/k" << "missing";
    QTest::newRow("wrong shape") << "reshape-v" << "/prompts/p0/engine/snapshot_0/rank_0/layers.1.self_attn/v"
        << "shape [24, 2, 3, 3], expected [24, 2, 2, 3]";
    QTest::newRow("unsupported dtype") << "dtype-int4" << "/prompts/p0/reference/expected/layers.0.self_attn/k"
        << "unsupported dtype 'int4'";
    QTest::newRow("dtype disagrees with storage") << "dtype-lie" << "/prompts/p0/reference/expected/layers.0.self_attn/v"
        << "cannot hold float32";
    QTest::newRow("absurd logits size") << "huge-logits" << "/prompts/p0/logits/actual" << "must be [steps, vocab]";
    QTest::newRow("absurd reference size") << "huge-reference" << "/prompts/p0/reference/expected/layers.2.self_attn/k"
        << "disagrees with the config";
    QTest::newRow("missing expected reference") << "delete-expected" << "/prompts/p0/reference/expected"
        << "the expected reference KV is required";
    QTest::newRow("bf16 bits stored signed") << "signed-bits" << "/prompts/p0/reference/expected/layers.1.self_attn/v"
        << "must be unsigned";
    QTest::newRow("dataset never written") << "unwritten" << "/prompts/p0/reference/expected/layers.0.self_attn/k"
        << "never written";
    QTest::newRow("absurd length of another row") << "seq-lens" << "/prompts/p0/engine/snapshot_0/seq_lens"
        << "not plausible";
    QTest::newRow("attribute holding two strings") << "format-array" << "/" << "must be a single string";
    QTest::newRow("block table wrong shape") << "table-shape" << "/prompts/p0/engine/snapshot_0/block_tables/group_1"
        << "must be integers [batch=2, max_blocks]";
}

void TestBundleIo::badInput()
{
    QFETCH(QString, damage);
    QFETCH(QString, object);
    QFETCH(QString, problem);
    const QString path = m_dir.filePath("bad_" + damage + ".h5");
    if (damage == "text") {
        QFile f(path);
        f.open(QIODevice::WriteOnly);
        f.write("layer,value\n0,1\n");
    } else if (damage != "missing") {
        writeBundle(path, DType::BFloat16, false);
    }
    if (damage == "truncate")
        QFile(path).resize(QFileInfo(path).size() / 2);
    const bool damagedInPlace = damage != "missing" && damage != "text" && damage != "truncate";
    if (damagedInPlace)
        modify(path, [&](hid_t f) {
        if (damage == "format") {
            H5Adelete(f, "format");
            const hid_t str = H5Tcopy(H5T_C_S1);
            H5Tset_size(str, 15);
            const hid_t sp = H5Screate(H5S_SCALAR);
            const hid_t a = H5Acreate2(f, "format", str, sp, H5P_DEFAULT, H5P_DEFAULT);
            H5Awrite(a, str, "something-else");
            H5Aclose(a), H5Sclose(sp), H5Tclose(str);
        } else if (damage == "version") {
            const std::int64_t three = 3;
            const hid_t a = H5Aopen(f, "format_version", H5P_DEFAULT);
            H5Awrite(a, H5T_NATIVE_INT64, &three);
            H5Aclose(a);
        } else if (damage == "config-text") {
            replaceConfig(f, "{\"num_blocks\": 24, \"groups\": [");
        } else if (damage == "config-field") {
            replaceConfig(f, "{\"tp_size\": 2, \"total_num_kv_heads\": 4, \"groups\": []}");
        } else if (damage == "config-head-size") {
            std::string json = smallConfig("torch.bfloat16").toJson();
            for (std::size_t at; (at = json.find("\"head_size\":3")) != std::string::npos;)
                json.replace(at, 13, "\"head_size\":5");
            replaceConfig(f, json);
        } else if (damage == "delete-k") {
            H5Ldelete(f, "/prompts/p0/engine/snapshot_0/rank_1/layers.2.self_attn/k", H5P_DEFAULT);
        } else if (damage == "reshape-v") {
            replaceWithFloats(f, "/prompts/p0/engine/snapshot_0/rank_0/layers.1.self_attn/v", {24, 2, 3, 3});
        } else if (damage == "dtype-int4" || damage == "dtype-lie") {
            const char* target = damage == "dtype-int4" ? "/prompts/p0/reference/expected/layers.0.self_attn/k"
                                                        : "/prompts/p0/reference/expected/layers.0.self_attn/v";
            const hid_t d = H5Dopen2(f, target, H5P_DEFAULT);
            H5Adelete(d, "dtype");
            const hid_t str = H5Tcopy(H5T_C_S1);
            H5Tset_size(str, 8);
            const hid_t sp = H5Screate(H5S_SCALAR);
            const hid_t a = H5Acreate2(d, "dtype", str, sp, H5P_DEFAULT, H5P_DEFAULT);
            H5Awrite(a, str, damage == "dtype-int4" ? "int4\0\0\0\0" : "float32\0");
            H5Aclose(a), H5Sclose(sp), H5Tclose(str), H5Dclose(d);
        } else if (damage == "huge-logits") {
            replaceWithFloats(f, "/prompts/p0/logits/actual", {hsize_t(1) << 30, hsize_t(1) << 30});
        } else if (damage == "huge-reference") {
            replaceWithFloats(f, "/prompts/p0/reference/expected/layers.2.self_attn/k", {1, 4, hsize_t(1) << 40, 3});
        } else if (damage == "delete-expected") {
            H5Ldelete(f, "/prompts/p0/reference/expected", H5P_DEFAULT);
        } else if (damage == "signed-bits") {
            const char* target = "/prompts/p0/reference/expected/layers.1.self_attn/v";
            H5Ldelete(f, target, H5P_DEFAULT);
            const std::vector<std::int16_t> bits(60, -16512);  // bf16 -1.0 read as int16
            const hid_t d = createChecksummed(f, target, H5T_STD_I16LE, {1, 4, 5, 3});
            H5Dwrite(d, H5T_NATIVE_INT16, H5S_ALL, H5S_ALL, H5P_DEFAULT, bits.data());
            const hid_t str = H5Tcopy(H5T_C_S1);
            H5Tset_size(str, 9);
            const hid_t asp = H5Screate(H5S_SCALAR);
            const hid_t a = H5Acreate2(d, "dtype", str, asp, H5P_DEFAULT, H5P_DEFAULT);
            H5Awrite(a, str, "bfloat16");
            H5Aclose(a), H5Sclose(asp), H5Tclose(str), H5Dclose(d);
        } else if (damage == "unwritten") {
            replaceWithFloats(f, "/prompts/p0/reference/expected/layers.0.self_attn/k", {1, 4, 10, 3});
        } else if (damage == "seq-lens") {
            const std::int64_t lens[2] = {10, std::int64_t(1) << 62};
            const hid_t d = H5Dopen2(f, "/prompts/p0/engine/snapshot_0/seq_lens", H5P_DEFAULT);
            H5Dwrite(d, H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, lens);
            H5Dclose(d);
        } else if (damage == "format-array") {
            H5Adelete(f, "format");
            const hid_t str = H5Tcopy(H5T_C_S1);
            H5Tset_size(str, 16);
            const hsize_t two = 2;
            const hid_t sp = H5Screate_simple(1, &two, nullptr);
            const hid_t a = H5Acreate2(f, "format", str, sp, H5P_DEFAULT, H5P_DEFAULT);
            H5Awrite(a, str, "kvscope-capture\0kvscope-capture");
            H5Aclose(a), H5Sclose(sp), H5Tclose(str);
        } else if (damage == "table-shape") {
            H5Ldelete(f, "/prompts/p0/engine/snapshot_0/block_tables/group_1", H5P_DEFAULT);
            const hsize_t dims[2] = {3, 6};
            const hid_t sp = H5Screate_simple(2, dims, nullptr);
            const hid_t d = H5Dcreate2(f, "/prompts/p0/engine/snapshot_0/block_tables/group_1", H5T_STD_I32LE, sp,
                                       H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
            H5Dclose(d), H5Sclose(sp);
        }
    });

    // Every way of using the bundle: open, validate, and read every prompt's every layer.
    std::string message;
    try {
        auto reader = std::make_shared<BundleReader>(path.toStdString());
        std::vector<std::string> problems = reader->validate();
        const CaptureLoader loader(reader);
        for (const PromptInfo& p : reader->prompts())
            for (const std::string& layer : reader->config().layerNames()) {
                loader.engineLayer(p.id, layer);
                loader.referenceLayer(p.id, ReferenceRole::Expected, layer);
                if (!p.logits.empty())
                    reader->readLogits(p.id, LogitsRole::Actual);
            }
        QVERIFY2(!problems.empty(), "validate() found nothing wrong");
    } catch (const std::exception& e) {
        message = e.what();
    }
    QVERIFY2(!message.empty(), "damaged bundle was read without error");
    QVERIFY2(message.find(path.toStdString()) != std::string::npos, message.c_str());
    QVERIFY2(message.find(object.toStdString()) != std::string::npos, message.c_str());
    QVERIFY2(message.find(problem.toStdString()) != std::string::npos, message.c_str());
}

void TestBundleIo::writerRefusesInconsistentInput()
{
    const QString path = m_dir.filePath("refused.h5");
    const KvCacheConfig cfg = smallConfig("torch.bfloat16");
    std::mt19937 rng(1);
    {
        BundleWriter writer(path.toStdString(), {}, cfg);
        writer.addPrompt({"p0", {1, 2}, {}, std::nullopt, {}});
        EngineSnapshot s;
        s.seqLens = {3};
        s.blockTables = {table({{1}}, 1), table({{2, 3}}, 2)};
        s.ranks.resize(2);
        for (int r = 0; r < 2; ++r)
            for (std::size_t l = 0; l < 3; ++l)
                s.ranks[std::size_t(r)][kLayers[l]] = {randomTensor(DType::BFloat16, {24, 2, l == 1 ? 2 : 4, 3}, rng),
                                                       randomTensor(DType::BFloat16, {24, 2, l == 1 ? 2 : 4, 3}, rng)};
        s.ranks[1][kLayers[2]].second.shape = {24, 2, 4, 4};
        expectBundleError([&] { writer.addSnapshot("p0", s); },
                          {"refused.h5", "rank_1/layers.2.self_attn/v", "shape [24, 2, 4, 4], the config implies [24, 2, 4, 3]"});
        s.ranks[1][kLayers[2]].second.shape = {24, 2, 4, 3};
        s.ranks[0][kLayers[0]].first.dtype = DType::Float16;
        expectBundleError([&] { writer.addSnapshot("p0", s); }, {"float16 but the config says bfloat16"});
        s.ranks[0][kLayers[0]].first.dtype = DType::BFloat16;
        s.ranks[0]["layers.9.self_attn"] = s.ranks[0][kLayers[0]];
        expectBundleError([&] { writer.addSnapshot("p0", s); }, {"layers.9.self_attn", "belongs to no group"});
        s.ranks[0].erase("layers.9.self_attn");
        writer.addSnapshot("p0", s);
        expectBundleError([&] { writer.finish(); }, {"expected", "must cover every layer"});
    }
    // Not finished: nothing is left behind under either name.
    QVERIFY(!QFileInfo::exists(path));
    QVERIFY(!QFileInfo::exists(path + ".partial"));
}

void TestBundleIo::messagesEscapeFileText()
{
    // Bytes from a file (an attribute, a name) reach the message escaped, never raw.
    const BundleError e("f.h5", std::string("/prompts/p\xff"), std::string("dtype 'bf\x01\x80' is not supported; caf\xc3\xa9"));
    const std::string what = e.what();
    QCOMPARE(what, std::string("f.h5: /prompts/p\\xff: dtype 'bf\\x01\\x80' is not supported; caf\xc3\xa9"));
    QCOMPARE(printable(std::string("\xe2\x82")), std::string("\\xe2\\x82"));  // a truncated sequence
    QCOMPARE(printable(std::string("\xf0\x9f\x99\x82 ok")), std::string("\xf0\x9f\x99\x82 ok"));
}

void TestBundleIo::probeStopsACrashOrAHang()
{
#if defined(__SANITIZE_THREAD__)
    QSKIP("no probe child under ThreadSanitizer (it does not support fork() with threads)");
#endif
    const QString path = m_dir.filePath("probed.h5");
    writeBundle(path, DType::BFloat16, false);
    BundleReader::probeInChild(path.toStdString());  // a good file passes

    // libhdf5 crashing in the child: a message, and this process lives on. (The signal named
    // is SIGSEGV's, or SIGABRT's where a sanitizer catches the fault and aborts.)
    expectBundleError([&] { BundleReader::probeInChild(path.toStdString(), [] { std::raise(SIGSEGV); }); },
                      {"probed.h5", "crashed the HDF5 library ("});

    // libhdf5 looping in the child: stopped at the limit, not when the child would end.
    QElapsedTimer timer;
    timer.start();
    expectBundleError([&] {
        BundleReader::probeInChild(path.toStdString(), [] { sleep(30); }, std::chrono::milliseconds(300));
    }, {"probed.h5", "did not finish within 0.3 s", "it was not opened"});
    QVERIFY2(timer.elapsed() < 10000, qPrintable(QString::number(timer.elapsed())));
}

QTEST_APPLESS_MAIN(TestBundleIo)
#include "tst_bundle_io.moc"

namespace {
struct Visit {
    QStringList unchecked, variableStrings;
};

herr_t visitObject(hid_t file, const char* name, const H5O_info_t* info, void* data)
{
    auto* visit = static_cast<Visit*>(data);
    const auto noteStrings = [&](hid_t type, const QString& what) {
        if (H5Tget_class(type) == H5T_STRING && H5Tis_variable_str(type) > 0)
            visit->variableStrings << what;
    };
    for (hsize_t i = 0; i < info->num_attrs; ++i) {
        const hid_t a = H5Aopen_by_idx(file, name, H5_INDEX_NAME, H5_ITER_INC, i, H5P_DEFAULT, H5P_DEFAULT);
        char attrName[256] = {};
        H5Aget_name(a, sizeof attrName, attrName);
        const hid_t type = H5Aget_type(a);
        noteStrings(type, QString("%1@%2").arg(name, attrName));
        H5Tclose(type), H5Aclose(a);
    }
    if (info->type != H5O_TYPE_DATASET)
        return 0;
    const hid_t d = H5Dopen2(file, name, H5P_DEFAULT);
    const hid_t type = H5Dget_type(d), space = H5Dget_space(d), dcpl = H5Dget_create_plist(d);
    noteStrings(type, name);
    unsigned flags = 0, config = 0;
    std::size_t n = 0;
    const bool checksummed = H5Pget_layout(dcpl) == H5D_CHUNKED &&
        H5Pget_filter_by_id2(dcpl, H5Z_FILTER_FLETCHER32, &flags, &n, nullptr, 0, nullptr, &config) >= 0;
    if (H5Sget_simple_extent_npoints(space) > 0 && !checksummed)
        visit->unchecked << name;
    H5Pclose(dcpl), H5Sclose(space), H5Tclose(type), H5Dclose(d);
    return 0;
}
}  // namespace

// Format v2, read back with plain HDF5 calls: newest superblock (checksummed), no
// variable-length string anywhere, a Fletcher32 checksum on every dataset with data.
void TestBundleIo::writesFormatV2()
{
    const QString path = m_dir.filePath("v2.h5");
    writeBundle(path, DType::BFloat16, false);
    const hid_t file = H5Fopen(path.toUtf8().constData(), H5F_ACC_RDONLY, H5P_DEFAULT);
    QVERIFY(file >= 0);
    const hid_t fcpl = H5Fget_create_plist(file);
    unsigned superblock = 0, freelist = 0, symbolTable = 0, sharedHeader = 0;
    H5Pget_version(fcpl, &superblock, &freelist, &symbolTable, &sharedHeader);
    H5Pclose(fcpl);
    QVERIFY2(superblock >= 2, "superblock versions before 2 have no checksum");
    std::int64_t version = 0;
    const hid_t a = H5Aopen(file, "format_version", H5P_DEFAULT);
    H5Aread(a, H5T_NATIVE_INT64, &version);
    H5Aclose(a);
    QCOMPARE(version, std::int64_t(2));
    Visit visit;
    H5Ovisit(file, H5_INDEX_NAME, H5_ITER_INC, visitObject, &visit);
    H5Fclose(file);
    QVERIFY2(visit.variableStrings.isEmpty(), qPrintable(visit.variableStrings.join(", ")));
    QVERIFY2(visit.unchecked.isEmpty(), qPrintable(visit.unchecked.join(", ")));
}

void TestBundleIo::fletcher32IsHdf5s_data()
{
    QTest::addColumn<int>("bytes");
    for (int bytes : {1, 2, 3, 31, 32, 33, 64, 719, 720, 721, 722, 4096, 65537, 131078})
        QTest::newRow(qPrintable(QString::number(bytes))) << bytes;
}

// HDF5's own filter is the reference: its stored checksum after a chunk's data must be ours.
void TestBundleIo::fletcher32IsHdf5s()
{
    QFETCH(int, bytes);
    std::vector<unsigned char> data(static_cast<std::size_t>(bytes));
    std::mt19937 random(static_cast<std::uint32_t>(bytes));
    for (unsigned char& c : data)
        c = static_cast<unsigned char>(random() >> 7 | (bytes == 4096 ? 0xff : 0));  // 4096: all-ones words, the wrap case
    const QString path = m_dir.filePath(QString("f32_%1.h5").arg(bytes));
    const hid_t file = H5Fcreate(path.toUtf8().constData(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    const hid_t d = createChecksummed(file, "x", H5T_STD_U8LE, {hsize_t(bytes)});
    H5Dwrite(d, H5T_NATIVE_UCHAR, H5S_ALL, H5S_ALL, H5P_DEFAULT, data.data());
    H5Dflush(d);
    const hsize_t origin = 0;
    hsize_t stored = 0;
    QVERIFY(H5Dget_chunk_storage_size(d, &origin, &stored) >= 0);
    QCOMPARE(stored, hsize_t(bytes) + 4);
    std::vector<unsigned char> chunk(static_cast<std::size_t>(stored));
    std::uint32_t filters = 0;
    QVERIFY(H5Dread_chunk(d, H5P_DEFAULT, &origin, &filters, chunk.data()) >= 0);
    H5Dclose(d), H5Fclose(file);
    QVERIFY(std::equal(data.begin(), data.end(), chunk.begin()));
    QVERIFY(fletcher32Matches(data.data(), data.size(), chunk.data() + bytes));
    // The same sum over the data in pieces of even length (their ends at and across HDF5's
    // folds every 360 words), the last one odd where the whole is.
    for (const std::size_t piece : {std::size_t(2), std::size_t(358), std::size_t(720), std::size_t(722), std::size_t(4098)}) {
        Fletcher32Sum sum;
        const std::size_t even = data.size() - data.size() % 2;
        for (std::size_t at = 0; at < even; at += piece)
            sum.add(data.data() + at, std::min(piece, even - at));
        QCOMPARE(sum.finish(data.size() % 2 ? &data.back() : nullptr), storedFletcher32(chunk.data() + bytes));
    }
    data[std::size_t(bytes) / 2] ^= 0x10;
    QVERIFY(!fletcher32Matches(data.data(), data.size(), chunk.data() + bytes));
}

void TestBundleIo::flippedBitIsAnError_data()
{
    QTest::addColumn<QString>("dataset");
    QTest::addColumn<bool>("referencedOnly");
    // Engine blocks are verified by kvscope's own chunk reader, the rest by HDF5's filter.
    QTest::newRow("engine block") << "/prompts/p0/engine/snapshot_0/rank_1/layers.2.self_attn/v" << false;
    QTest::newRow("engine block, referenced only") << "/prompts/p0/engine/snapshot_0/rank_0/layers.0.self_attn/k" << true;
    QTest::newRow("reference") << "/prompts/p0/reference/expected/layers.1.self_attn/k" << false;
    QTest::newRow("logits") << "/prompts/p0/logits/actual" << false;
    QTest::newRow("input ids") << "/prompts/p0/input_ids" << false;
}

// One bit flipped in a dataset's stored bytes: reading it is an error naming the dataset
// and the checksum, never a number.
void TestBundleIo::flippedBitIsAnError()
{
    QFETCH(QString, dataset);
    QFETCH(bool, referencedOnly);
    const QString path = m_dir.filePath("flip.h5");
    QFile::remove(path);
    writeBundle(path, DType::BFloat16, referencedOnly);
    haddr_t address = HADDR_UNDEF;
    {
        const hid_t file = H5Fopen(path.toUtf8().constData(), H5F_ACC_RDONLY, H5P_DEFAULT);
        const hid_t d = H5Dopen2(file, dataset.toUtf8().constData(), H5P_DEFAULT);
        const hid_t space = H5Dget_space(d);
        unsigned filters = 0;
        hsize_t size = 0;
        QVERIFY(H5Dget_chunk_info(d, space, 0, nullptr, &filters, &address, &size) >= 0);
        H5Sclose(space), H5Dclose(d), H5Fclose(file);
    }
    QFile f(path);
    QVERIFY(f.open(QIODevice::ReadWrite));
    f.seek(qint64(address) + 1);
    char byte = 0;
    f.getChar(&byte);
    f.seek(qint64(address) + 1);
    f.putChar(char(byte ^ 0x04));
    f.close();

    std::string message;
    try {
        auto reader = std::make_shared<BundleReader>(path.toStdString());
        const CaptureLoader loader(reader);
        for (const std::string& layer : reader->config().layerNames()) {
            loader.engineLayer("p0", layer);
            loader.referenceLayer("p0", ReferenceRole::Expected, layer);
        }
        reader->readLogits("p0", LogitsRole::Actual);
    } catch (const std::exception& e) {
        message = e.what();
    }
    QVERIFY2(!message.empty(), "a flipped bit was read as data");
    QVERIFY2(message.find(dataset.toStdString()) != std::string::npos, message.c_str());
    QVERIFY2(message.find("checksum") != std::string::npos, message.c_str());
}
