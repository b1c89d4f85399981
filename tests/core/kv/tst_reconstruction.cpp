// Paged-to-contiguous reconstruction, TP merge, sliding windows, snapshot merging and
// reference alignment, on small hand-built caches whose contents follow a closed formula.

#include "kv/reconstruction.h"
#include "kv/reference_alignment.h"
#include "kv/snapshot_merge.h"
#include "test_support.h"

#include <QTest>

using namespace kvscope;
using namespace kvtest;

class TestReconstruction : public QObject {
    Q_OBJECT

private slots:
    void tpMerge_data();
    void tpMerge();
    void replicatedIgnoresOtherReplicas();
    void decodeContextParallel_data();
    void decodeContextParallel();
    void missingDcpShareIsAnError();
    void twoGroupsWithDifferentBlockSizes();
    void groupsWithDifferentHeadCounts();
    void slidingWindowSpecHidesFreedPositions();
    void chunkedLocalHidesEarlierChunks();
    void fullAttentionWithSlidingWindowKeepsAll();
    void nullBlockWhereNeededIsAnError();
    void nullBlockCanBeMarkedAbsent();
    void outOfRangeBlockIsAnError();
    void layerWithoutGroupIsAnError();
    void shardShapeMustMatchConfig();
    void batchReconstruction();
    void requiredBlocksSkipsFreedWindow();
    void mergeTakesDivergenceFromLaterSnapshot();
    void mergeRangesAreValidated();
    void referenceAlignment();
};

void TestReconstruction::tpMerge_data()
{
    QTest::addColumn<int>("totalHeads");
    QTest::addColumn<int>("tp");
    QTest::newRow("8 heads / TP 4 (partitioned)") << 8 << 4;
    QTest::newRow("2 heads / TP 8 (replicated)") << 2 << 8;
    QTest::newRow("16 heads / TP 8 (partitioned)") << 16 << 8;
    QTest::newRow("1 head / TP 1") << 1 << 1;
}

void TestReconstruction::tpMerge()
{
    QFETCH(int, totalHeads);
    QFETCH(int, tp);
    const auto cfg = KvCacheConfig::fromJson(configJson(12, tp, totalHeads, 3, {{{"layers.0.self_attn"}, "FullAttentionSpec", 4}}));
    // 10 written positions in 3 shuffled blocks; the table row is longer than needed.
    const std::vector<std::vector<std::int32_t>> rows{{7, 2, 9, -1, -1}};
    const LayerShards shards = handPagedLayer(cfg, 0, 0, rows, {10});
    const LayerKv kv = reconstructLayer(cfg, "layers.0.self_attn", shards, table(rows, 5), 0, 10);
    QCOMPARE(kv.heads, totalHeads);
    verifyLayer(kv, 0, std::vector<bool>(10, true));
}

void TestReconstruction::replicatedIgnoresOtherReplicas()
{
    // 2 heads over 8 ranks: stride 4, ranks 0 and 4 hold heads 0 and 1. Others are garbage.
    const auto cfg = KvCacheConfig::fromJson(configJson(6, 8, 2, 2, {{{"l0"}, "FullAttentionSpec", 2}}));
    QCOMPARE(cfg.layout(cfg.groups[0]).contributingRanks(), (std::vector<int>{0, 4}));
    const std::vector<std::vector<std::int32_t>> rows{{3, 1, 5}};
    const LayerShards shards = handPagedLayer(cfg, 0, 0, rows, {5}, {1, 2, 3, 5, 6, 7});
    verifyLayer(reconstructLayer(cfg, "l0", shards, table(rows, 3), 0, 5), 0, std::vector<bool>(5, true));
}

namespace {

// A layer of one sequence as vLLM lays it under decode context parallelism, written from its
// slot mapping (vllm/v1/worker/block_table.py), not from kvscope's: the table maps virtual
// blocks of block_size * dcp positions; position p with off = p % virtual is local to DCP rank
// (off / interleave) % dcp, at block offset off / (dcp * interleave) * interleave + off % interleave.
// Every rank's other slots, and every rank outside the first DCP group of each head, hold garbage.
LayerShards dcpPagedLayer(const KvCacheConfig& cfg, const std::vector<std::int32_t>& row, std::int64_t length,
                          int dcp, int interleave)
{
    const KvCacheGroup& g = cfg.groups[0];
    const int hpr = cfg.layout(cfg.groups[0]).headsPerRank(), bs = g.blockSize, dim = g.headSize;
    const int copies = cfg.tpSize / cfg.totalNumKvHeads;
    LayerShards shards;
    for (int r = 0; r < cfg.tpSize; ++r)
        for (KvPart part : {KvPart::K, KvPart::V}) {
            std::vector<float> data(std::size_t(cfg.numBlocks) * hpr * bs * dim);
            for (std::int64_t b = 0; b < cfg.numBlocks; ++b)
                for (int o = 0; o < bs; ++o)
                    for (int d = 0; d < dim; ++d)
                        data[std::size_t((b * bs + o) * dim + d)] = garbage(b, r, o, d);
            const int head = r / copies, dcpRank = r % dcp;
            if (r % copies < dcp)  // the first DCP group of this head's ranks
                for (std::int64_t p = 0; p < length; ++p) {
                    const std::int64_t virtualBlock = std::int64_t(bs) * dcp, off = p % virtualBlock;
                    if ((off / interleave) % dcp != dcpRank)
                        continue;
                    const std::int64_t phys = row[std::size_t(p / virtualBlock)];
                    const std::int64_t local = off / (std::int64_t(dcp) * interleave) * interleave + off % interleave;
                    for (int d = 0; d < dim; ++d)
                        data[std::size_t((phys * bs + local) * dim + d)] = trueValue(0, head, p, d, part);
                }
            PagedShard shard;
            shard.blocks = RawTensor::fromFloat(DType::Float32, {cfg.numBlocks, hpr, bs, dim}, data);
            for (std::int64_t b = 0; b < cfg.numBlocks; ++b)
                shard.physicalIds.push_back(b);
            (part == KvPart::K ? shards.k : shards.v).push_back(std::move(shard));
        }
    return shards;
}

KvCacheConfig dcpConfig(int tp, int heads, int dcp, int interleave)
{
    std::string json = configJson(12, tp, heads, 2, {{{"l0"}, "FullAttentionSpec", 4}});
    json.replace(json.find("\"dcp_size\": 1"), 13,
                 "\"dcp_size\": " + std::to_string(dcp) + ", \"cp_kv_cache_interleave_size\": " + std::to_string(interleave));
    return KvCacheConfig::fromJson(json);
}

}  // namespace

void TestReconstruction::decodeContextParallel_data()
{
    QTest::addColumn<int>("tp");
    QTest::addColumn<int>("heads");
    QTest::addColumn<int>("dcp");
    QTest::addColumn<int>("interleave");
    QTest::newRow("1 head, tp 4, dcp 2") << 4 << 1 << 2 << 1;
    QTest::newRow("1 head, tp 4, dcp 4") << 4 << 1 << 4 << 1;
    QTest::newRow("2 heads, tp 4, dcp 2") << 4 << 2 << 2 << 1;
    QTest::newRow("2 heads, tp 8, dcp 2, runs of 2") << 8 << 2 << 2 << 2;
    QTest::newRow("1 head, tp 2, dcp 2, runs of 4 (whole blocks)") << 2 << 1 << 2 << 4;
}

void TestReconstruction::decodeContextParallel()
{
    QFETCH(int, tp);
    QFETCH(int, heads);
    QFETCH(int, dcp);
    QFETCH(int, interleave);
    const KvCacheConfig cfg = dcpConfig(tp, heads, dcp, interleave);
    const std::int64_t length = 4 * dcp * 2 + 3;  // two whole entries and part of a third
    const std::vector<std::int32_t> row{7, 2, 9};
    const LayerShards shards = dcpPagedLayer(cfg, row, length, dcp, interleave);
    verifyLayer(reconstructLayer(cfg, "l0", shards, table({row}, 3), 0, length), 0,
                std::vector<bool>(std::size_t(length), true));
    // The table bounds the positions: three entries of 4 * dcp.
    expectBundleError([&] { reconstructLayer(cfg, "l0", shards, table({row}, 3), 0, 4 * dcp * 3 + 1); },
                      {"3 entries per row", "need 4"});
}

void TestReconstruction::missingDcpShareIsAnError()
{
    const KvCacheConfig cfg = dcpConfig(4, 1, 2, 1);
    LayerShards shards = dcpPagedLayer(cfg, {3, 5}, 12, 2, 1);
    shards.k[1] = PagedShard{};  // DCP rank 1's share of K
    expectBundleError([&] { reconstructLayer(cfg, "l0", shards, table({{3, 5}}, 2), 0, 12); },
                      {"k shard of TP rank 1 is missing", "DCP rank 1 of 2"});
    // A share without a block the table names.
    shards = dcpPagedLayer(cfg, {3, 5}, 12, 2, 1);
    shards.v[1].physicalIds[5] = 11;
    expectBundleError([&] { reconstructLayer(cfg, "l0", shards, table({{3, 5}}, 2), 0, 12); },
                      {"physical block 5 is missing from TP rank 1's shard", "DCP rank 1, which holds position 9"});
}

void TestReconstruction::groupsWithDifferentHeadCounts()
{
    // TP 4: group 0 has the model's 8 KV heads (2 per rank), group 1 its own 2 (each on two ranks).
    std::string json = configJson(8, 4, 8, 2, {{{"l0"}, "FullAttentionSpec", 4}, {{"l1"}, "FullAttentionSpec", 2}});
    const std::string second = "\"num_kv_heads\": 2, \"head_size\": 2, \"attention_chunk_size\": null}]";
    json.replace(json.find(second), second.size(),
                 "\"num_kv_heads\": 1, \"total_num_kv_heads\": 2, \"head_size\": 2, \"attention_chunk_size\": null}]");
    const KvCacheConfig cfg = KvCacheConfig::fromJson(json);
    QCOMPARE(cfg.groups[1].totalKvHeads, 2);
    QCOMPARE(cfg.layout(cfg.groups[1]).contributingRanks(), (std::vector<int>{0, 2}));
    QCOMPARE(cfg.maxKvHeads(), 8);
    const std::vector<std::vector<std::int32_t>> rows0{{3, 5}}, rows1{{6, 1, 7}};
    const LayerKv l0 = reconstructLayer(cfg, "l0", handPagedLayer(cfg, 0, 0, rows0, {6}), table(rows0, 2), 0, 6);
    QCOMPARE(l0.heads, 8);
    verifyLayer(l0, 0, std::vector<bool>(6, true));
    // Ranks 1 and 3 (copies) hold garbage: never read.
    const LayerKv l1 = reconstructLayer(cfg, "l1", handPagedLayer(cfg, 1, 1, rows1, {6}, {1, 3}), table(rows1, 3), 0, 6);
    QCOMPARE(l1.heads, 2);
    verifyLayer(l1, 1, std::vector<bool>(6, true));
    // The engine's dict form keeps the group's own count.
    QCOMPARE(KvCacheConfig::fromJson(cfg.toJson()).groups[1].totalKvHeads, 2);
    // A group whose heads per rank disagree with its own total is refused, naming the group.
    json.replace(json.find("\"num_kv_heads\": 1, \"total"), 17, "\"num_kv_heads\": 2");
    expectBundleError([&] { KvCacheConfig::fromJson(json, "b.h5"); },
                      {"groups[1].num_kv_heads", "disagrees with total_num_kv_heads 2 over tp_size 4"});
}

void TestReconstruction::twoGroupsWithDifferentBlockSizes()
{
    const auto cfg = KvCacheConfig::fromJson(configJson(16, 2, 4, 2,
        {{{"layers.0.self_attn", "layers.2.self_attn"}, "FullAttentionSpec", 4},
         {{"layers.1.self_attn"}, "FullAttentionSpec", 2}}));
    const std::vector<std::vector<std::int32_t>> rows0{{11, 3, 6}};
    const std::vector<std::vector<std::int32_t>> rows1{{8, 15, 1, 12, 4, 9}};
    const LayerShards l0 = handPagedLayer(cfg, 0, 0, rows0, {11});
    const LayerShards l1 = handPagedLayer(cfg, 1, 1, rows1, {11});
    const LayerShards l2 = handPagedLayer(cfg, 0, 2, rows0, {11});
    verifyLayer(reconstructLayer(cfg, "layers.0.self_attn", l0, table(rows0, 3), 0, 11), 0, std::vector<bool>(11, true));
    verifyLayer(reconstructLayer(cfg, "layers.1.self_attn", l1, table(rows1, 6), 0, 11), 1, std::vector<bool>(11, true));
    verifyLayer(reconstructLayer(cfg, "layers.2.self_attn", l2, table(rows0, 3), 0, 11), 2, std::vector<bool>(11, true));
    QCOMPARE(cfg.layerNames(), (std::vector<std::string>{"layers.0.self_attn", "layers.1.self_attn", "layers.2.self_attn"}));
}

void TestReconstruction::slidingWindowSpecHidesFreedPositions()
{
    // Window 5 at 14 written positions: only positions 10..13 (window - 1) are held.
    // Logical blocks 0 and 1 were freed: one is the null block, the other a stale id whose
    // block now holds someone else's data (garbage). Neither may be read.
    const auto cfg = KvCacheConfig::fromJson(configJson(12, 1, 2, 2, {{{"l0"}, "SlidingWindowSpec", 4, 5}}));
    const std::vector<std::vector<std::int32_t>> rows{{-1, 6, 2, 9}};
    const std::vector<std::int64_t> from{8};  // the engine rewrote block 6 for another sequence
    const LayerShards shards = handPagedLayer(cfg, 0, 0, rows, {14}, {}, &from);
    std::vector<bool> expect(14, false);
    for (int p = 10; p < 14; ++p)
        expect[std::size_t(p)] = true;
    verifyLayer(reconstructLayer(cfg, "l0", shards, table(rows, 4), 0, 14), 0, expect);
    QCOMPARE(firstHeldPosition(cfg.groups[0], 14), std::int64_t(10));
    QCOMPARE(firstHeldPosition(cfg.groups[0], 3), std::int64_t(0));
}

void TestReconstruction::chunkedLocalHidesEarlierChunks()
{
    // Chunks of 8 at 14 written positions: the next token (14) is in chunk 1, so positions 0..7
    // are not attended and their blocks (0 and 1, of 4) were freed; 8..13 are held.
    const auto cfg = KvCacheConfig::fromJson(configJson(12, 1, 2, 2, {{{"l0"}, "ChunkedLocalAttentionSpec", 4, 0, 8}}));
    const std::vector<std::vector<std::int32_t>> rows{{-1, 6, 2, 9}};
    const std::vector<std::int64_t> from{8};  // block 6 was freed and rewritten for another sequence
    const LayerShards shards = handPagedLayer(cfg, 0, 0, rows, {14}, {}, &from);
    std::vector<bool> expect(14, false);
    for (int p = 8; p < 14; ++p)
        expect[std::size_t(p)] = true;
    verifyLayer(reconstructLayer(cfg, "l0", shards, table(rows, 4), 0, 14), 0, expect);
    QCOMPARE(firstHeldPosition(cfg.groups[0], 14), std::int64_t(8));
    QCOMPARE(firstHeldPosition(cfg.groups[0], 8), std::int64_t(8));  // the next token opens chunk 1
    QCOMPARE(firstHeldPosition(cfg.groups[0], 7), std::int64_t(0));
}

void TestReconstruction::fullAttentionWithSlidingWindowKeepsAll()
{
    const auto cfg = KvCacheConfig::fromJson(configJson(12, 1, 2, 2, {{{"l0"}, "FullAttentionSpec", 4, 5}}));
    const std::vector<std::vector<std::int32_t>> rows{{4, 6, 2, 9}};
    const LayerShards shards = handPagedLayer(cfg, 0, 0, rows, {14});
    verifyLayer(reconstructLayer(cfg, "l0", shards, table(rows, 4), 0, 14), 0, std::vector<bool>(14, true));
}

void TestReconstruction::nullBlockWhereNeededIsAnError()
{
    const auto cfg = KvCacheConfig::fromJson(configJson(8, 1, 1, 2, {{{"l0"}, "FullAttentionSpec", 4}}));
    const std::vector<std::vector<std::int32_t>> rows{{5, -1, 3}};
    const LayerShards shards = handPagedLayer(cfg, 0, 0, rows, {10});
    ReconstructOptions options;
    options.file = "cap.h5";
    options.object = "/prompts/p/engine/snapshot_0";
    expectBundleError([&] { reconstructLayer(cfg, "l0", shards, table(rows, 3), 0, 10, options); },
                      {"cap.h5", "snapshot_0", "layer 'l0'", "logical block 1", "null block (-1)"});
}

void TestReconstruction::nullBlockCanBeMarkedAbsent()
{
    const auto cfg = KvCacheConfig::fromJson(configJson(8, 1, 1, 2, {{{"l0"}, "FullAttentionSpec", 4}}));
    const std::vector<std::vector<std::int32_t>> rows{{5, -1, 3}};
    const LayerShards shards = handPagedLayer(cfg, 0, 0, rows, {10});
    ReconstructOptions options;
    options.unreadableBlocks = UnreadableBlockPolicy::MarkAbsent;
    std::vector<std::string> issues;
    const LayerKv kv = reconstructLayer(cfg, "l0", shards, table(rows, 3), 0, 10, options, &issues);
    std::vector<bool> expect(10, true);
    for (int p = 4; p < 8; ++p)
        expect[std::size_t(p)] = false;
    verifyLayer(kv, 0, expect);
    QCOMPARE(issues.size(), std::size_t(1));
    QVERIFY(issues[0].find("positions 4..7") != std::string::npos);
}

void TestReconstruction::outOfRangeBlockIsAnError()
{
    const auto cfg = KvCacheConfig::fromJson(configJson(8, 1, 1, 2, {{{"l0"}, "FullAttentionSpec", 4}}));
    const std::vector<std::vector<std::int32_t>> rows{{5, 8, 3}};
    const LayerShards shards = handPagedLayer(cfg, 0, 0, {{5, -1, 3}}, {10});
    expectBundleError([&] { reconstructLayer(cfg, "l0", shards, table(rows, 3), 0, 10); },
                      {"physical block 8", "outside [0, num_blocks=8)"});
    // A row too short for the sequence is an error, not a read past the row.
    expectBundleError([&] { reconstructLayer(cfg, "l0", shards, table({{5, 1}}, 2), 0, 10); },
                      {"2 entries per row", "need 3"});
}

void TestReconstruction::layerWithoutGroupIsAnError()
{
    const auto cfg = KvCacheConfig::fromJson(configJson(8, 1, 1, 2, {{{"l0"}, "FullAttentionSpec", 4}}));
    const LayerShards shards = handPagedLayer(cfg, 0, 0, {{1}}, {3});
    expectBundleError([&] { reconstructLayer(cfg, "l7", shards, table({{1}}, 1), 0, 3); },
                      {"layer 'l7'", "belongs to no KV cache group"});
}

void TestReconstruction::shardShapeMustMatchConfig()
{
    const auto cfg = KvCacheConfig::fromJson(configJson(8, 2, 4, 2, {{{"l0"}, "FullAttentionSpec", 4}}));
    LayerShards shards = handPagedLayer(cfg, 0, 0, {{1}}, {3});
    shards.v[1].blocks.shape[1] = 1;  // rank 1 claims one head
    expectBundleError([&] { reconstructLayer(cfg, "l0", shards, table({{1}}, 1), 0, 3); },
                      {"v shard of TP rank 1", "shape [8, 1, 4, 2]", "implies [8, 2, 4, 2]"});
    shards = handPagedLayer(cfg, 0, 0, {{1}}, {3});
    shards.k.pop_back();
    expectBundleError([&] { reconstructLayer(cfg, "l0", shards, table({{1}}, 1), 0, 3); },
                      {"k shard of TP rank 1 is missing"});
    shards = handPagedLayer(cfg, 0, 0, {{1}}, {3});
    shards.k[0].blocks = RawTensor::fromFloat(DType::BFloat16, shards.k[0].blocks.shape, shards.k[0].blocks.toFloat());
    expectBundleError([&] { reconstructLayer(cfg, "l0", shards, table({{1}}, 1), 0, 3); },
                      {"is bfloat16, the config says float32"});
}

void TestReconstruction::batchReconstruction()
{
    // Two sequences in one batch: their layout differs only in values by layer index, so
    // lay them as two layers' worth of data in disjoint blocks of one pool.
    const auto cfg = KvCacheConfig::fromJson(configJson(12, 2, 2, 2, {{{"l0"}, "FullAttentionSpec", 2}}));
    const std::vector<std::vector<std::int32_t>> rows{{3, 10, 1}, {7, 2, -1}};
    const LayerShards shards = handPagedLayer(cfg, 0, 0, rows, {5, 3});
    verifyLayer(reconstructLayer(cfg, "l0", shards, table(rows, 3), 0, 5), 0, std::vector<bool>(5, true));
    verifyLayer(reconstructLayer(cfg, "l0", shards, table(rows, 3), 1, 3), 0, std::vector<bool>(3, true));
}

void TestReconstruction::requiredBlocksSkipsFreedWindow()
{
    const auto cfg = KvCacheConfig::fromJson(configJson(12, 1, 1, 2, {{{"l0"}, "SlidingWindowSpec", 4, 5}}));
    QCOMPARE(requiredBlocks(cfg, "l0", table({{-1, 6, 2, 9}}, 4), 0, 14), (std::vector<std::int64_t>{2, 9}));
    const auto full = KvCacheConfig::fromJson(configJson(12, 1, 1, 2, {{{"l0"}, "FullAttentionSpec", 4, 5}}));
    QCOMPARE(requiredBlocks(full, "l0", table({{4, 6, 2, 9}}, 4), 0, 14), (std::vector<std::int64_t>{2, 4, 6, 9}));
}

void TestReconstruction::mergeTakesDivergenceFromLaterSnapshot()
{
    // Snapshot 0: seq_len 10, the engine's token at 7 differed from the teacher token; its
    // KV at 7 and 8 is the wrong token's. Snapshot 1 re-prefilled the teacher token at 7
    // and ran on to seq_len 13. Position 12 (last sampled token) was never written.
    const int heads = 2, dim = 3;
    std::vector<std::unique_ptr<RawTensor>> stored;  // what the snapshots' runs point into
    auto snapshot = [&](std::int64_t written, float wrongFrom) {
        std::vector<float> k, v;  // [position, head, dim]
        for (std::int64_t p = 0; p < written; ++p)
            for (int h = 0; h < heads; ++h)
                for (int d = 0; d < dim; ++d) {
                    const bool wrong = p >= wrongFrom;
                    k.push_back(wrong ? -99.0f : trueValue(0, h, p, d, KvPart::K));
                    v.push_back(wrong ? -99.0f : trueValue(0, h, p, d, KvPart::V));
                }
        stored.push_back(std::make_unique<RawTensor>(RawTensor::fromFloat(DType::Float32, {written, heads, dim}, k)));
        const RawTensor* kt = stored.back().get();
        stored.push_back(std::make_unique<RawTensor>(RawTensor::fromFloat(DType::Float32, {written, heads, dim}, v)));
        const RawTensor* vt = stored.back().get();
        LayerSource source = LayerSource::absent(heads, written, dim, 1);
        for (std::int64_t p = 0; p < written; ++p) {
            source.runs(KvPart::K, p)[0] = {kt, p * heads * dim, dim};
            source.runs(KvPart::V, p)[0] = {vt, p * heads * dim, dim};
            source.present[std::size_t(p)] = 1;
        }
        return source;
    };
    const std::vector<PositionRange> ranges = contributedRanges({{10, 7}, {13, 12}});
    QCOMPARE(ranges.size(), std::size_t(2));
    QCOMPARE(ranges[0].begin, std::int64_t(0));
    QCOMPARE(ranges[0].end, std::int64_t(7));
    QCOMPARE(ranges[1].begin, std::int64_t(7));
    QCOMPARE(ranges[1].end, std::int64_t(12));
    SnapshotMerger merger(heads, 13, dim, 1);
    merger.add(snapshot(9, 7), ranges[0]);
    merger.add(snapshot(12, 1000), ranges[1]);
    std::vector<bool> expect(13, true);
    expect[12] = false;
    verifyLayer(merger.take().materialize(), 0, expect);

    // A snapshot that validates nothing new and a gap that no snapshot wrote.
    SnapshotMerger gap(heads, 13, dim, 1);
    const std::vector<PositionRange> r2 = contributedRanges({{10, 10}, {13, 10}});
    gap.add(snapshot(9, 1000), r2[0]);  // holds 0..8 only: 9 stays absent
    gap.add(snapshot(12, 1000), r2[1]);
    std::vector<bool> expectGap(13, false);
    for (int p = 0; p < 9; ++p)
        expectGap[std::size_t(p)] = true;
    verifyLayer(gap.take().materialize(), 0, expectGap);
}

void TestReconstruction::mergeRangesAreValidated()
{
    expectBundleError([] { contributedRanges({{10, 8}, {13, 6}}, "f.h5", "/prompts/a/engine"); },
                      {"f.h5", "/prompts/a/engine, snapshot 1", "goes back"});
    expectBundleError([] { contributedRanges({{10, 11}}, "f.h5", "x"); }, {"exceeds seq_len 10"});
}

void TestReconstruction::referenceAlignment()
{
    const auto cfg = KvCacheConfig::fromJson(configJson(8, 1, 2, 3,
        {{{"full"}, "FullAttentionSpec", 4}, {{"slide"}, "SlidingWindowSpec", 4, 5},
         {{"chunk"}, "ChunkedLocalAttentionSpec", 4, 0, 6}}));
    auto reference = [&](std::int64_t batch, std::int64_t seq, std::int64_t offset, KvPart part) {
        std::vector<float> values;
        for (std::int64_t b = 0; b < batch; ++b)
            for (int h = 0; h < 2; ++h)
                for (std::int64_t s = 0; s < seq; ++s)
                    for (int d = 0; d < 3; ++d)
                        values.push_back(b == 1 ? trueValue(0, h, s + offset, d, part) : -5.0f);
        return RawTensor::fromFloat(DType::Float32, {batch, 2, seq, 3}, values);
    };
    // Same length: all present; batch row 1 is the one asked for.
    verifyLayer(alignReference(reference(2, 9, 0, KvPart::K), reference(2, 9, 0, KvPart::V), 1, cfg, cfg.groups[0], 9,
                               "r.h5", "ref"), 0, std::vector<bool>(9, true));
    // HF kept window - 1 = 4 positions of a sliding layer: they are the last four.
    std::vector<bool> expect(9, false);
    for (int p = 5; p < 9; ++p)
        expect[std::size_t(p)] = true;
    verifyLayer(alignReference(reference(2, 4, 5, KvPart::K), reference(2, 4, 5, KvPart::V), 1, cfg, cfg.groups[1], 9,
                               "r.h5", "ref"), 0, expect);
    // Any other mismatch is an error.
    expectBundleError([&] { alignReference(reference(2, 4, 5, KvPart::K), reference(2, 4, 5, KvPart::V), 1, cfg,
                                           cfg.groups[0], 9, "r.h5", "/prompts/a/reference/expected/full/k"); },
                      {"r.h5", "/prompts/a/reference/expected/full/k", "sequence length 4 does not match the engine's 9"});
    expectBundleError([&] { alignReference(reference(2, 7, 0, KvPart::K), reference(2, 7, 0, KvPart::V), 1, cfg,
                                           cfg.groups[1], 9, "r.h5", "ref"); },
                      {"sequence length 7", "sliding window's 4"});
    expectBundleError([&] { alignReference(reference(1, 9, 0, KvPart::K), reference(1, 9, 0, KvPart::V), 1, cfg,
                                           cfg.groups[0], 9, "r.h5", "ref"); },
                      {"batch row 1 outside a batch of 1"});
    // Chunks of 6 over 9 positions: the last token (8) is in chunk 6..11, so a shorter reference
    // must hold 6..8 (3 positions) at least; it ends the sequence.
    std::vector<bool> chunkTail(9, false);
    for (int p = 5; p < 9; ++p)
        chunkTail[std::size_t(p)] = true;
    verifyLayer(alignReference(reference(2, 4, 5, KvPart::K), reference(2, 4, 5, KvPart::V), 1, cfg, cfg.groups[2], 9,
                               "r.h5", "ref"), 0, chunkTail);
    expectBundleError([&] { alignReference(reference(2, 2, 7, KvPart::K), reference(2, 2, 7, KvPart::V), 1, cfg,
                                           cfg.groups[2], 9, "r.h5", "ref"); },
                      {"sequence length 2", "nor covers the last chunk of 6 (its 3 positions)"});
}

QTEST_APPLESS_MAIN(TestReconstruction)
#include "tst_reconstruction.moc"
