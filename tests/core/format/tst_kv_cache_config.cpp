// The KV cache config: parsing as the engine reports it, TP layout, and rejection of
// configs that are malformed or inconsistent, with messages that say where.

#include "format/bundle_error.h"
#include "format/kv_cache_config.h"
#include "test_support.h"

#include <QTest>

#include <nlohmann/json.hpp>

#include <fstream>
#include <numeric>

using namespace kvscope;
using namespace kvtest;

class TestKvCacheConfig : public QObject {
    Q_OBJECT

private slots:
    void parsesEngineDict();
    void tpLayout_data();
    void tpLayout();
    void rejects_data();
    void rejects();
    void jsonRoundTrip();
    void hybridAndChunked();
    void mla_data();
    void mla();
    void dcpSlots_data();
    void dcpSlots();
    void groupHeadCounts();
    // tests/data/kv_cache_configs.json, the table of good and bad configs the Python reader and the
    // schema (docs/kv-cache-config.schema.json) read too (capture/tests/test_kv_cache_config_table.py).
    void sharedTable_data();
    void sharedTable();
};

void TestKvCacheConfig::parsesEngineDict()
{
    // As get_kv_cache_config returns it, with fields kvscope does not use.
    const std::string text = R"({"num_blocks": 4096, "tp_size": 4, "total_num_kv_heads": 8, "dcp_size": 1, "pcp_size": 1,
      "groups": [
        {"layer_names": ["model.layers.1.self_attn", "model.layers.3.self_attn"], "spec_type": "SlidingWindowSpec",
         "block_size": 16, "num_kv_heads": 2, "head_size": 64, "dtype": "torch.bfloat16", "sliding_window": 128,
         "attention_chunk_size": null, "page_size_bytes": 8192},
        {"layer_names": ["model.layers.0.self_attn", "model.layers.2.self_attn", "model.layers.10.self_attn"],
         "spec_type": "FullAttentionSpec", "block_size": 32, "num_kv_heads": 2, "head_size": 64,
         "dtype": "torch.bfloat16", "sliding_window": null}]})";
    const KvCacheConfig cfg = KvCacheConfig::fromJson(text, "f.h5");
    QCOMPARE(cfg.numBlocks, 4096);
    QCOMPARE(cfg.groups.size(), std::size_t(2));
    QCOMPARE(cfg.groups[0].specType, SpecType::SlidingWindow);
    QCOMPARE(cfg.groups[0].slidingWindow, std::optional<int>(128));
    QCOMPARE(cfg.groups[1].blockSize, 32);
    QVERIFY(!cfg.groups[1].slidingWindow);
    QCOMPARE(cfg.groupOf("model.layers.10.self_attn"), 1);
    QCOMPARE(cfg.groupOf("model.layers.4.self_attn"), -1);
    QCOMPARE(cfg.layerNames(), (std::vector<std::string>{"model.layers.0.self_attn", "model.layers.1.self_attn",
                                                          "model.layers.2.self_attn", "model.layers.3.self_attn",
                                                          "model.layers.10.self_attn"}));
    QCOMPARE(cfg.json, text);
}

void TestKvCacheConfig::tpLayout_data()
{
    QTest::addColumn<int>("total");
    QTest::addColumn<int>("tp");
    QTest::addColumn<int>("perRank");
    QTest::addColumn<bool>("replicated");
    QTest::addColumn<std::vector<int>>("ranks");
    QTest::newRow("8/8") << 8 << 8 << 1 << false << std::vector<int>{0, 1, 2, 3, 4, 5, 6, 7};
    QTest::newRow("2/8: stride 4") << 2 << 8 << 1 << true << std::vector<int>{0, 4};
    QTest::newRow("16/8") << 16 << 8 << 2 << false << std::vector<int>{0, 1, 2, 3, 4, 5, 6, 7};
    QTest::newRow("8/4") << 8 << 4 << 2 << false << std::vector<int>{0, 1, 2, 3};
    QTest::newRow("1/4: stride 4") << 1 << 4 << 1 << true << std::vector<int>{0};
}

void TestKvCacheConfig::tpLayout()
{
    QFETCH(int, total);
    QFETCH(int, tp);
    QFETCH(int, perRank);
    QFETCH(bool, replicated);
    QFETCH(std::vector<int>, ranks);
    const KvCacheConfig cfg = KvCacheConfig::fromJson(configJson(8, tp, total, 4, {{{"l0"}}}));
    QCOMPARE(cfg.layout(cfg.groups[0]).headsPerRank(), perRank);
    QCOMPARE(cfg.layout(cfg.groups[0]).mode() == TpMode::Replicated, replicated);
    QCOMPARE(cfg.layout(cfg.groups[0]).contributingRanks(), ranks);
}

void TestKvCacheConfig::rejects_data()
{
    QTest::addColumn<QString>("json");
    QTest::addColumn<QString>("where");
    QTest::addColumn<QString>("problem");
    const QString good = QString::fromStdString(configJson(8, 2, 4, 4, {{{"l0", "l1"}}}));
    auto edit = [&](const QString& from, const QString& to) { return QString(good).replace(from, to); };
    QTest::newRow("not JSON") << "{\"num_blocks\": 8," << "cfg" << "not valid JSON";
    QTest::newRow("not an object") << "[1, 2]" << "cfg" << "must be a JSON object";
    // Found by the fuzzer: a number JSON can spell but a double cannot hold.
    QTest::newRow("number overflow") << edit("\"num_blocks\": 8", "\"num_blocks\": 1e999") << "cfg" << "number overflow";
    QTest::newRow("num_blocks missing") << edit("\"num_blocks\": 8, ", "") << "cfg.num_blocks" << "missing";
    QTest::newRow("num_blocks absurd") << edit("\"num_blocks\": 8", "\"num_blocks\": 99999999999") << "cfg.num_blocks" << "outside";
    QTest::newRow("num_blocks not int") << edit("\"num_blocks\": 8", "\"num_blocks\": \"8\"") << "cfg.num_blocks" << "must be an integer";
    QTest::newRow("heads per rank") << edit("\"num_kv_heads\": 2", "\"num_kv_heads\": 4") << "cfg.groups[0].num_kv_heads"
                                    << "disagrees with total_num_kv_heads 4 over tp_size 2";
    QTest::newRow("uneven partition") << edit("\"total_num_kv_heads\": 4", "\"total_num_kv_heads\": 5")
                                      << "cfg.total_num_kv_heads" << "cannot be partitioned";
    QTest::newRow("MLA without its widths") << edit("FullAttentionSpec", "MLAAttentionSpec")
                                            << "cfg.groups[0].kv_lora_rank" << "missing";
    QTest::newRow("unknown spec") << edit("FullAttentionSpec", "FullAtentionSpec") << "cfg.groups[0].spec_type"
                                  << "'FullAtentionSpec' is not supported";
    QTest::newRow("chunked without size") << edit("FullAttentionSpec", "ChunkedLocalAttentionSpec")
                                          << "cfg.groups[0].attention_chunk_size" << "missing";
    QTest::newRow("dtype") << edit("torch.float32", "torch.int4") << "cfg.groups[0].dtype" << "unsupported dtype 'torch.int4'";
    QTest::newRow("duplicate layer") << edit("\"l1\"", "\"l0\"") << "cfg.groups[0].layer_names" << "more than one place";
    QTest::newRow("slash in name") << edit("\"l1\"", "\"a/b\"") << "cfg.groups[0].layer_names" << "cannot be an HDF5 name";
    QTest::newRow("sliding without window") << edit("FullAttentionSpec", "SlidingWindowSpec") << "cfg.groups[0].sliding_window"
                                            << "needs a sliding_window";
    QTest::newRow("prefill context parallel") << edit("\"pcp_size\": 1", "\"pcp_size\": 2") << "cfg.pcp_size" << "not supported";
    QTest::newRow("dcp not dividing tp") << edit("\"dcp_size\": 1", "\"dcp_size\": 3") << "cfg.dcp_size"
                                         << "3 does not divide tp_size 2";
    // vLLM bounds dcp_size by tp_size / heads: DCP splits the ranks that would hold copies of a head.
    QTest::newRow("dcp over partitioned heads") << edit("\"dcp_size\": 1", "\"dcp_size\": 2") << "cfg.dcp_size"
                                                << "needs each KV head on a multiple of 2 TP ranks; each of the 4 heads is on 1";
    const QString replicated = QString::fromStdString(configJson(8, 4, 2, 4, {{{"l0", "l1"}}}))
                                   .replace("\"dcp_size\": 1", "\"dcp_size\": 2, \"cp_kv_cache_interleave_size\": 3");
    QTest::newRow("interleave not dividing the block") << replicated << "cfg.cp_kv_cache_interleave_size"
                                                       << "3 does not divide groups[0].block_size 4";
    // A group with its own head count: checked against its own total, named by its own field.
    QTest::newRow("group total not partitioning") << edit("\"num_kv_heads\": 2", "\"num_kv_heads\": 2, \"total_num_kv_heads\": 3")
                                                  << "cfg.groups[0].total_num_kv_heads" << "3 heads cannot be partitioned over tp_size 2";
    QTest::newRow("heads per rank against the group's total")
        << edit("\"num_kv_heads\": 2", "\"num_kv_heads\": 2, \"total_num_kv_heads\": 2") << "cfg.groups[0].num_kv_heads"
        << "2 per rank disagrees with total_num_kv_heads 2 over tp_size 2";
    QTest::newRow("no groups") << edit("\"groups\": [", "\"groups\": [], \"x\": [") << "cfg.groups" << "non-empty list";
}

void TestKvCacheConfig::rejects()
{
    QFETCH(QString, json);
    QFETCH(QString, where);
    QFETCH(QString, problem);
    expectBundleError([&] { KvCacheConfig::fromJson(json.toStdString(), "bundle.h5", "cfg"); },
                      {"bundle.h5", where.toStdString(), problem.toStdString()});
}

void TestKvCacheConfig::jsonRoundTrip()
{
    const KvCacheConfig a = KvCacheConfig::fromJson(configJson(8, 2, 4, 4, {{{"l0"}, "SlidingWindowSpec", 16, 64}, {{"l1"}}}));
    const KvCacheConfig b = KvCacheConfig::fromJson(a.toJson());
    QCOMPARE(b.toJson(), a.toJson());
    QCOMPARE(b.groups[0].slidingWindow, std::optional<int>(64));
}

void TestKvCacheConfig::hybridAndChunked()
{
    // A hybrid model as vLLM reports it: attention groups (one chunked-local, with a block size
    // that the groups' shared page size makes 528) and a state-space group with no head fields.
    const std::string text = R"({"num_blocks": 64, "tp_size": 1, "total_num_kv_heads": 2,
      "groups": [
        {"layer_names": ["model.layers.0.attn", "model.layers.4.attn"], "spec_type": "ChunkedLocalAttentionSpec",
         "block_size": 528, "num_kv_heads": 2, "head_size": 64, "dtype": "torch.bfloat16", "attention_chunk_size": 8192},
        {"layer_names": ["model.layers.1.mixer", "model.layers.2.mixer", "model.layers.3.mixer"],
         "spec_type": "MambaSpec", "block_size": 528, "shapes": [[3, 8], [4, 8, 2]]},
        {"layer_names": ["model.layers.5.attn"], "spec_type": "FullAttentionSpec", "block_size": 528,
         "num_kv_heads": 2, "head_size": 64, "dtype": "torch.bfloat16"}]})";
    const KvCacheConfig cfg = KvCacheConfig::fromJson(text, "f.h5");
    QCOMPARE(cfg.groups[0].specType, SpecType::ChunkedLocal);
    QCOMPARE(cfg.groups[0].attentionChunkSize, std::optional<int>(8192));
    QCOMPARE(cfg.groups[1].specType, SpecType::NotCompared);
    QCOMPARE(cfg.layerNames(), (std::vector<std::string>{"model.layers.0.attn", "model.layers.4.attn",
                                                          "model.layers.5.attn"}));
    const auto skipped = cfg.notComparedLayers();
    QCOMPARE(skipped.size(), std::size_t(3));
    QCOMPARE(skipped[0].first, std::string("model.layers.1.mixer"));
    QCOMPARE(skipped[0].second, std::string("state-space layers"));
    QCOMPARE(cfg.firstCompared().headSize, 64);
    QCOMPARE(describeGroup(cfg.groups[1]), std::string("MambaSpec, 3 layers, not compared (state-space layers)"));
    QCOMPARE(describeGroup(cfg.groups[0]), std::string("ChunkedLocalAttentionSpec (attention_chunk_size 8192), "
                                                       "block_size 528, bfloat16, 2 layers, head_size 64"));
    const KvCacheConfig again = KvCacheConfig::fromJson(cfg.toJson());
    QCOMPARE(again.toJson(), cfg.toJson());
    QCOMPARE(again.notComparedLayers(), skipped);
}


void TestKvCacheConfig::mla_data()
{
    QTest::addColumn<QString>("edit");
    QTest::addColumn<QString>("where");
    QTest::addColumn<QString>("problem");
    QTest::newRow("as vLLM reports it") << "" << "" << "";
    QTest::newRow("widths that do not add up") << "\"kv_lora_rank\": 512=>\"kv_lora_rank\": 500" << "cfg.groups[0].head_size"
                                               << "576 is not kv_lora_rank 500 + qk_rope_head_dim 64";
    QTest::newRow("odd rotary dim") << "\"head_size\": 576=>\"head_size\": 575|\"qk_rope_head_dim\": 64=>\"qk_rope_head_dim\": 63"
                                    << "cfg.groups[0].qk_rope_head_dim" << "odd";
    QTest::newRow("two latent heads") << "\"num_kv_heads\": 1=>\"num_kv_heads\": 2" << "cfg.groups[0].num_kv_heads"
                                      << "disagrees with total_num_kv_heads 1";
    QTest::newRow("fp8_ds_mla") << "torch.bfloat16=>fp8_ds_mla" << "" << "";
    QTest::newRow("fp8_ds_mla, a rank not of 128") << "torch.bfloat16=>fp8_ds_mla|\"kv_lora_rank\": 512=>\"kv_lora_rank\": 448|\"head_size\": 576=>\"head_size\": 512"
                                                   << "cfg.groups[0].kv_lora_rank" << "multiple of 128";
    QTest::newRow("TP 3, the model's 128 heads not dividing") << "\"tp_size\": 8=>\"tp_size\": 3" << "" << "";
    QTest::newRow("no rotary part") << "\"head_size\": 576=>\"head_size\": 512|\"qk_rope_head_dim\": 64=>\"qk_rope_head_dim\": 0"
                                    << "cfg.groups[0].qk_rope_head_dim" << "outside [2, ";
    QTest::newRow("two splits")
        << "\"auto\"}]}=>\"auto\"}, {\"layer_names\": [\"model.layers.9.self_attn\"], \"spec_type\": \"MLAAttentionSpec\", \"block_size\": 64, \"num_kv_heads\": 1, \"head_size\": 576, \"kv_lora_rank\": 448, \"qk_rope_head_dim\": 128, \"dtype\": \"torch.bfloat16\"}]}"
        << "cfg.groups[1].kv_lora_rank" << "differs from another MLA group's (kv_lora_rank 512)";
    QTest::newRow("an indexer group marked not compared")
        << "\"auto\"}]}=>\"auto\"}, {\"layer_names\": [\"model.layers.0.self_attn.indexer\"], \"spec_type\": \"MLAAttentionSpec\", \"block_size\": 64, \"num_kv_heads\": 1, \"head_size\": 132, \"dtype\": \"torch.uint8\", \"not_compared\": \"sparse-attention indexer keys\"}]}"
        << "" << "";
    QTest::newRow("beside other attention")
        << "\"auto\"}]}=>\"auto\"}, {\"layer_names\": [\"model.layers.9.self_attn\"], \"spec_type\": \"FullAttentionSpec\", \"block_size\": 64, \"num_kv_heads\": 1, \"head_size\": 576, \"dtype\": \"torch.bfloat16\"}]}"
        << "cfg.groups[1].spec_type" << "mixing MLA and other attention";
}

void TestKvCacheConfig::mla()
{
    QFETCH(QString, edit);
    QFETCH(QString, where);
    QFETCH(QString, problem);
    // DeepSeek-V3 under TP 8, as get_kv_cache_config reports it (total_num_kv_heads is the model
    // config's 128: an MLA cache holds one latent, every rank all of it).
    QString text = R"({"num_blocks": 100, "tp_size": 8, "total_num_kv_heads": 128, "groups": [
        {"layer_names": ["model.layers.0.self_attn", "model.layers.1.self_attn"], "spec_type": "MLAAttentionSpec",
         "block_size": 64, "num_kv_heads": 1, "head_size": 576, "kv_lora_rank": 512, "qk_rope_head_dim": 64,
         "dtype": "torch.bfloat16", "sliding_window": null, "cache_dtype_str": "auto"}]})";
    for (const QString& change : edit.split('|', Qt::SkipEmptyParts)) {
        const qsizetype arrow = change.indexOf("=>");
        QVERIFY2(text.contains(change.left(arrow)), qPrintable(change));
        text.replace(change.left(arrow), change.mid(arrow + 2));
    }
    if (!problem.isEmpty()) {
        expectBundleError([&] { KvCacheConfig::fromJson(text.toStdString(), "f.h5", "cfg"); },
                          {"f.h5", where.toStdString(), problem.toStdString()});
        return;
    }
    const KvCacheConfig cfg = KvCacheConfig::fromJson(text.toStdString(), "f.h5", "cfg");
    const KvCacheGroup& g = cfg.groups[0];
    QCOMPARE(g.specType, SpecType::Mla);
    QVERIFY(cfg.isMla());
    QCOMPARE(g.partWidth(KvPart::K), edit.contains("448") ? 448 : 512);
    QCOMPARE(g.partWidth(KvPart::V), 64);
    QCOMPARE(std::string(partLabel(g, KvPart::K)), std::string("c_kv"));
    QCOMPARE(std::string(partLabel(g, KvPart::V)), std::string("k_pe"));
    // TP replicates the latent: one head, on every rank, rank 0's copy read.
    QCOMPARE(cfg.totalNumKvHeads, 1);
    QCOMPARE(cfg.layout(cfg.groups[0]).mode(), TpMode::Replicated);
    std::vector<int> every(std::size_t(cfg.tpSize));
    std::iota(every.begin(), every.end(), 0);
    QCOMPARE(cfg.layout(cfg.groups[0]).ranksHolding(0), every);
    QCOMPARE(cfg.layout(cfg.groups[0]).contributingRanks(), std::vector<int>{0});
    const bool ds = edit.contains("fp8_ds_mla");
    QCOMPARE(g.dsMla, ds);
    QCOMPARE(g.partDType(KvPart::K), ds ? DType::Float8E4M3 : DType::BFloat16);
    QCOMPARE(g.partDType(KvPart::V), DType::BFloat16);
    if (edit.contains("indexer")) {
        QCOMPARE(cfg.notComparedLayers().size(), std::size_t(1));
        QCOMPARE(cfg.notComparedLayers().front().second, std::string("sparse-attention indexer keys"));
        QCOMPARE(KvCacheConfig::fromJson(cfg.toJson()).notComparedLayers(), cfg.notComparedLayers());
    }
    // Written back, it reads the same.
    const KvCacheConfig again = KvCacheConfig::fromJson(cfg.toJson());
    QCOMPARE(again.groups[0].kvLoraRank, g.kvLoraRank);
    QCOMPARE(again.groups[0].qkRopeHeadDim, 64);
    QCOMPARE(again.groups[0].dsMla, ds);
    QVERIFY(describeGroup(g).find("kv_lora_rank 512 + qk_rope_head_dim 64") != std::string::npos || ds);
}

// Where decode context parallelism puts a position, worked by hand from vLLM's slot mapping
// (vllm/v1/worker/block_table.py): a table entry covers block_size x dcp positions; inside it,
// runs of `interleave` positions go to DCP ranks in turn, and each rank fills its block in order.
void TestKvCacheConfig::dcpSlots_data()
{
    QTest::addColumn<int>("dcp");
    QTest::addColumn<int>("interleave");
    QTest::addColumn<qint64>("pos");
    QTest::addColumn<qint64>("entry");
    QTest::addColumn<int>("offset");
    QTest::addColumn<int>("dcpRank");
    // block_size 4 throughout.
    QTest::newRow("no DCP") << 1 << 1 << qint64(9) << qint64(2) << 1 << 0;
    QTest::newRow("dcp 2: 0") << 2 << 1 << qint64(0) << qint64(0) << 0 << 0;
    QTest::newRow("dcp 2: 1 on rank 1") << 2 << 1 << qint64(1) << qint64(0) << 0 << 1;
    QTest::newRow("dcp 2: 2") << 2 << 1 << qint64(2) << qint64(0) << 1 << 0;
    QTest::newRow("dcp 2: 7, last of entry 0") << 2 << 1 << qint64(7) << qint64(0) << 3 << 1;
    QTest::newRow("dcp 2: 8, next entry") << 2 << 1 << qint64(8) << qint64(1) << 0 << 0;
    QTest::newRow("dcp 4: 13") << 4 << 1 << qint64(13) << qint64(0) << 3 << 1;
    QTest::newRow("dcp 4: 21") << 4 << 1 << qint64(21) << qint64(1) << 1 << 1;
    // interleave 2: positions 0,1 -> rank 0 slots 0,1; 2,3 -> rank 1 slots 0,1; 4,5 -> rank 0 slots 2,3.
    QTest::newRow("dcp 2, runs of 2: 3") << 2 << 2 << qint64(3) << qint64(0) << 1 << 1;
    QTest::newRow("dcp 2, runs of 2: 4") << 2 << 2 << qint64(4) << qint64(0) << 2 << 0;
    QTest::newRow("dcp 2, runs of 2: 7") << 2 << 2 << qint64(7) << qint64(0) << 3 << 1;
    QTest::newRow("dcp 2, runs of 2: 9") << 2 << 2 << qint64(9) << qint64(1) << 1 << 0;
    // interleave = block_size: whole blocks alternate.
    QTest::newRow("dcp 2, runs of 4: 5") << 2 << 4 << qint64(5) << qint64(0) << 1 << 1;
}

void TestKvCacheConfig::dcpSlots()
{
    QFETCH(int, dcp);
    QFETCH(int, interleave);
    QFETCH(qint64, pos);
    std::string json = configJson(64, 4, 1, 8, {{{"l0"}}});
    json.replace(json.find("\"dcp_size\": 1"), 13,
                 "\"dcp_size\": " + std::to_string(dcp) + ", \"cp_kv_cache_interleave_size\": " + std::to_string(interleave));
    const KvCacheConfig cfg = KvCacheConfig::fromJson(json);
    QCOMPARE(cfg.dcpSize, dcp);
    QCOMPARE(cfg.positionsPerEntry(cfg.groups[0]), std::int64_t(4 * dcp));
    const TokenSlot slot = cfg.slotOf(cfg.groups[0], pos);
    QTEST(qint64(slot.entry), "entry");
    QTEST(slot.offset, "offset");
    QTEST(slot.dcpRank, "dcpRank");
    // One head on 4 ranks: DCP groups are consecutive ranks; the analysis reads the first group.
    std::vector<int> firstGroup(std::size_t(dcp), 0);
    std::iota(firstGroup.begin(), firstGroup.end(), 0);
    QCOMPARE(cfg.layout(cfg.groups[0]).ranksRead(), firstGroup);
    QCOMPARE(cfg.layout(cfg.groups[0]).ranksHolding(0, dcp - 1), (dcp == 4 ? std::vector<int>{3} : dcp == 2 ? std::vector<int>{1, 3} : std::vector<int>{0, 1, 2, 3}));
    // The engine's dict form keeps it.
    QCOMPARE(KvCacheConfig::fromJson(cfg.toJson()).cpInterleave, interleave);
}

QTEST_APPLESS_MAIN(TestKvCacheConfig)
#include "tst_kv_cache_config.moc"

void TestKvCacheConfig::groupHeadCounts()
{
    // Layers of 1 KV head (replicated over TP 4) beside layers of 8 (2 per rank, partitioned).
    const std::string text = R"({"num_blocks": 8, "tp_size": 4, "total_num_kv_heads": 8, "dcp_size": 1, "pcp_size": 1,
      "groups": [
        {"layer_names": ["l0", "l2"], "spec_type": "SlidingWindowSpec", "sliding_window": 8, "block_size": 4,
         "num_kv_heads": 1, "total_num_kv_heads": 1, "head_size": 4, "dtype": "torch.bfloat16"},
        {"layer_names": ["l1"], "spec_type": "FullAttentionSpec", "block_size": 4,
         "num_kv_heads": 2, "head_size": 4, "dtype": "torch.bfloat16"}]})";
    const KvCacheConfig cfg = KvCacheConfig::fromJson(text);
    QCOMPARE(cfg.groups[0].totalKvHeads, 1);
    QCOMPARE(cfg.groups[1].totalKvHeads, 8);
    QCOMPARE(cfg.maxKvHeads(), 8);
    const TpLayout sliding = cfg.layoutOf("l2");
    QCOMPARE(sliding.mode(), TpMode::Replicated);
    QCOMPARE(sliding.contributingRanks(), std::vector<int>{0});
    QCOMPARE(sliding.ranksHolding(0), (std::vector<int>{0, 1, 2, 3}));
    const TpLayout full = cfg.layoutOf("l1");
    QCOMPARE(full.mode(), TpMode::Partitioned);
    QCOMPARE(full.headsPerRank(), 2);
    QCOMPARE(full.ranksHolding(5), std::vector<int>{2});
    // Written back with the group's own count only where it differs from the config's.
    const KvCacheConfig again = KvCacheConfig::fromJson(cfg.toJson());
    QCOMPARE(again.groups[0].totalKvHeads, 1);
    QCOMPARE(again.groups[1].totalKvHeads, 8);
    QVERIFY(cfg.toJson().find("\"total_num_kv_heads\":1") != std::string::npos ||
            cfg.toJson().find("\"total_num_kv_heads\": 1") != std::string::npos);
}

void TestKvCacheConfig::sharedTable_data()
{
    QTest::addColumn<QString>("config");
    QTest::addColumn<bool>("valid");
    std::ifstream in(KVSCOPE_CONFIG_TABLE);
    QVERIFY2(in, KVSCOPE_CONFIG_TABLE);
    const nlohmann::json table = nlohmann::json::parse(in);
    QVERIFY(table.is_array());
    int good = 0, bad = 0;
    for (const nlohmann::json& entry : table) {
        const std::string name = entry.at("name").get<std::string>();
        const bool valid = entry.at("valid").get<bool>();
        (valid ? good : bad)++;
        QTest::newRow(name.c_str()) << QString::fromStdString(entry.at("config").dump()) << valid;
    }
    QVERIFY(good >= 15);
    QVERIFY(bad >= 25);
}

void TestKvCacheConfig::sharedTable()
{
    QFETCH(QString, config);
    QFETCH(bool, valid);
    const std::string text = config.toStdString();
    if (!valid) {
        try {
            KvCacheConfig::fromJson(text, "table.h5");
        } catch (const BundleError& e) {
            QVERIFY2(std::string(e.what()).find("table.h5") != std::string::npos, e.what());
            return;
        }
        QFAIL("a bad config was accepted");
    }
    KvCacheConfig cfg;
    try {
        cfg = KvCacheConfig::fromJson(text, "table.h5");
    } catch (const BundleError& e) {
        QFAIL(e.what());
    }
    // A few values against the table's JSON.
    const nlohmann::json json = nlohmann::json::parse(text);
    QCOMPARE(cfg.numBlocks, json.at("num_blocks").get<int>());
    QCOMPARE(cfg.tpSize, json.at("tp_size").get<int>());
    const nlohmann::json dcp = json.value("dcp_size", nlohmann::json());
    QCOMPARE(cfg.dcpSize, dcp.is_null() || dcp.get<int>() == 0 ? 1 : dcp.get<int>());
    const nlohmann::json& groups = json.at("groups");
    QCOMPARE(cfg.groups.size(), groups.size());
    for (std::size_t g = 0; g < groups.size(); ++g) {
        const nlohmann::json& listed = groups[g];
        const KvCacheGroup& group = cfg.groups[g];
        QCOMPARE(group.layerNames, listed.at("layer_names").get<std::vector<std::string>>());
        QCOMPARE(group.specName, listed.at("spec_type").get<std::string>());
        if (group.specType == SpecType::NotCompared)
            continue;
        QCOMPARE(group.blockSize, listed.at("block_size").get<int>());
        QCOMPARE(group.headSize, listed.at("head_size").get<int>());
        QCOMPARE(group.numKvHeads, listed.at("num_kv_heads").get<int>());
    }
}
