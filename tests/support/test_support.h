#pragma once
// Helpers shared by the tests: hand-built paged caches whose contiguous contents are known
// by construction (a closed formula), and checks on error messages.

#include "format/bundle_error.h"
#include "format/kv_cache_config.h"
#include "kv/layer_kv.h"
#include "format/paged_kv.h"

#include <QTest>

#include <cmath>
#include <functional>
#include <string>
#include <vector>

namespace kvtest {

// The true value of element d of head h at position p of layer l: exact in float32.
inline float trueValue(int layer, int head, std::int64_t pos, int d, kvscope::KvPart part)
{
    return float(layer * 100000 + pos * 1000 + head * 32 + d) + (part == kvscope::KvPart::V ? 0.5f : 0.0f);
}

inline float garbage(std::int64_t block, int head, int offset, int d)
{
    return -1.0f - float(block * 7 + head * 3 + offset * 5 + d);
}

struct GroupSpec {
    std::vector<std::string> layers;
    std::string specType = "FullAttentionSpec";
    int blockSize = 4;
    int slidingWindow = 0;  // 0 = null
    int attentionChunkSize = 0;  // 0 = null
};

inline std::string configJson(int numBlocks, int tpSize, int totalHeads, int headSize,
                              const std::vector<GroupSpec>& groups, const std::string& dtype = "torch.float32")
{
    std::string s = "{\"num_blocks\": " + std::to_string(numBlocks) + ", \"tp_size\": " + std::to_string(tpSize) +
                    ", \"total_num_kv_heads\": " + std::to_string(totalHeads) +
                    ", \"dcp_size\": 1, \"pcp_size\": 1, \"groups\": [";
    const int perRank = std::max(1, totalHeads / tpSize);
    for (std::size_t g = 0; g < groups.size(); ++g) {
        s += g ? ", {" : "{";
        s += "\"layer_names\": [";
        for (std::size_t i = 0; i < groups[g].layers.size(); ++i)
            s += (i ? ", \"" : "\"") + groups[g].layers[i] + "\"";
        s += "], \"spec_type\": \"" + groups[g].specType + "\", \"block_size\": " + std::to_string(groups[g].blockSize) +
             ", \"sliding_window\": " + (groups[g].slidingWindow ? std::to_string(groups[g].slidingWindow) : "null") +
             ", \"dtype\": \"" + dtype + "\", \"num_kv_heads\": " + std::to_string(perRank) +
             ", \"head_size\": " + std::to_string(headSize) + ", \"attention_chunk_size\": " +
             (groups[g].attentionChunkSize ? std::to_string(groups[g].attentionChunkSize) : "null") + "}";
    }
    return s + "]}";
}

// Lays the true values of `layerIndex` for one sequence into every rank's blocks, the way
// the engine does: block table row entries give the physical block of each logical block.
// Slots not written hold garbage. `garbageRanks` get garbage instead of their replica data.
inline kvscope::LayerShards handPagedLayer(const kvscope::KvCacheConfig& cfg, int group, int layerIndex,
                                           const std::vector<std::vector<std::int32_t>>& rows,
                                           const std::vector<std::int64_t>& lengths,
                                           const std::vector<int>& garbageRanks = {},
                                           const std::vector<std::int64_t>* layoutFrom = nullptr)
{
    const kvscope::KvCacheGroup& g = cfg.groups[std::size_t(group)];
    const int hpr = cfg.layout(g).headsPerRank();
    kvscope::LayerShards shards;
    for (int r = 0; r < cfg.tpSize; ++r) {
        for (kvscope::KvPart part : {kvscope::KvPart::K, kvscope::KvPart::V}) {
            std::vector<float> data(std::size_t(cfg.numBlocks) * hpr * g.blockSize * g.headSize);
            auto at = [&](std::int64_t b, int j, int o, int d) -> float& {
                return data[std::size_t(((b * hpr + j) * g.blockSize + o) * g.headSize + d)];
            };
            for (std::int64_t b = 0; b < cfg.numBlocks; ++b)
                for (int j = 0; j < hpr; ++j)
                    for (int o = 0; o < g.blockSize; ++o)
                        for (int d = 0; d < g.headSize; ++d)
                            at(b, j, o, d) = garbage(b, j, o, d);
            const bool isGarbage = std::find(garbageRanks.begin(), garbageRanks.end(), r) != garbageRanks.end();
            for (std::size_t row = 0; row < rows.size() && !isGarbage; ++row) {
                const std::int64_t from = layoutFrom ? (*layoutFrom)[row] : 0;
                for (std::size_t lb = 0; lb < rows[row].size(); ++lb) {
                    const std::int32_t phys = rows[row][lb];
                    if (phys < 0)
                        continue;
                    for (int o = 0; o < g.blockSize; ++o) {
                        const std::int64_t pos = std::int64_t(lb) * g.blockSize + o;
                        if (pos >= lengths[row] || pos < from)
                            continue;
                        for (int j = 0; j < hpr; ++j) {
                            const int head = cfg.layout(g).mode() == kvscope::TpMode::Partitioned
                                                 ? r * hpr + j
                                                 : r / (cfg.tpSize / g.totalKvHeads);
                            for (int d = 0; d < g.headSize; ++d)
                                at(phys, j, o, d) = trueValue(layerIndex, head, pos, d, part);
                        }
                    }
                }
            }
            kvscope::PagedShard shard;
            shard.blocks = kvscope::RawTensor::fromFloat(
                kvscope::DType::Float32, {cfg.numBlocks, hpr, g.blockSize, g.headSize}, data);
            for (std::int64_t b = 0; b < cfg.numBlocks; ++b)
                shard.physicalIds.push_back(b);
            (part == kvscope::KvPart::K ? shards.k : shards.v).push_back(std::move(shard));
        }
    }
    return shards;
}

inline kvscope::BlockTable table(const std::vector<std::vector<std::int32_t>>& rows, std::int64_t cols)
{
    kvscope::BlockTable t;
    t.rows = std::int64_t(rows.size());
    t.cols = cols;
    for (const auto& row : rows)
        for (std::int64_t c = 0; c < cols; ++c)
            t.entries.push_back(c < std::int64_t(row.size()) ? row[std::size_t(c)] : -1);
    return t;
}

// Checks every present/absent flag and every present value against the formula.
inline void verifyLayer(const kvscope::LayerKv& kv, int layerIndex, const std::vector<bool>& expectPresent)
{
    QCOMPARE(kv.seq, std::int64_t(expectPresent.size()));
    for (std::int64_t p = 0; p < kv.seq; ++p) {
        QVERIFY2(bool(kv.present[std::size_t(p)]) == expectPresent[std::size_t(p)],
                 qPrintable(QString("position %1: present=%2").arg(p).arg(kv.present[std::size_t(p)])));
        for (int h = 0; h < kv.heads; ++h)
            for (int d = 0; d < kv.headDim(kvscope::KvPart::K); ++d) {  // K and V alike here
                const float k = kv.kAt(h, p)[d];
                const float v = kv.vAt(h, p)[d];
                if (expectPresent[std::size_t(p)]) {
                    if (k != trueValue(layerIndex, h, p, d, kvscope::KvPart::K) ||
                        v != trueValue(layerIndex, h, p, d, kvscope::KvPart::V))
                        QFAIL(qPrintable(QString("pos %1 head %2 dim %3: k=%4 v=%5").arg(p).arg(h).arg(d).arg(k).arg(v)));
                } else if (!std::isnan(k) || !std::isnan(v)) {
                    QFAIL(qPrintable(QString("absent pos %1 holds a number").arg(p)));
                }
            }
    }
}

// Runs `fn`, which must throw BundleError whose message holds every one of `parts`.
inline void expectBundleError(const std::function<void()>& fn, const std::vector<std::string>& parts)
{
    try {
        fn();
    } catch (const kvscope::BundleError& e) {
        const std::string message = e.what();
        for (const std::string& part : parts)
            QVERIFY2(message.find(part) != std::string::npos,
                     qPrintable(QString::fromStdString("'" + part + "' not in: " + message)));
        return;
    }
    QFAIL("no BundleError thrown");
}

}  // namespace kvtest
