#pragma once
// Hand-built producer / consumer captures for kvscope transfer: engine-only bundles of the same
// requests, written block by block through BundleWriter, so that a test can change any block of
// the consumer (or of the producer's earlier requests) before writing it. Values are
// deterministic, distinct for every prompt, layer, position, head and part, and exact in bf16.

#include "format/bundle_writer.h"
#include "format/dtype.h"

#include <algorithm>
#include <array>
#include <cstdint>
#include <string>
#include <vector>

namespace kvtest {

struct TransferShape {
    int layers = 2;
    int heads = 2;       // every KV head
    int tpSize = 1;
    int headDim = 8;
    int blockSize = 16;
    std::string model = "transfer-test";
};

// One prompt of one side: its tokens, how many positions the engine wrote, the physical block
// of each entry, and each layer's blocks by entry: [layer][part][entry][head][row][dim].
struct SidePrompt {
    std::string id;
    std::vector<std::int64_t> tokens;
    std::int64_t written = 0;
    std::vector<std::int32_t> physical;
    std::vector<std::array<std::vector<float>, 2>> blocks;

    float* row(const TransferShape& s, int layer, int part, std::int64_t entry, int head, int r)
    {
        return blocks[std::size_t(layer)][std::size_t(part)].data() +
               ((std::size_t(entry) * std::size_t(s.heads) + std::size_t(head)) * std::size_t(s.blockSize) + std::size_t(r)) *
                   std::size_t(s.headDim);
    }
    const float* row(const TransferShape& s, int layer, int part, std::int64_t entry, int head, int r) const
    {
        return const_cast<SidePrompt*>(this)->row(s, layer, part, entry, head, r);
    }
    float* position(const TransferShape& s, int layer, int part, std::int64_t pos, int head)
    {
        return row(s, layer, part, pos / s.blockSize, head, int(pos % s.blockSize));
    }
};

struct Side {
    TransferShape shape;
    std::vector<SidePrompt> prompts;
    kvscope::DType dtype = kvscope::DType::BFloat16;
    // A quantised side: each part's scale per layer (real value = code x scale); `storedScaleFactor`
    // multiplies the scale recorded (a wrong scale: codes made with one, another written).
    std::vector<float> scales;
    float storedScaleFactor = 1.0f;
    int numBlocks = 64;
};

inline float transferValue(std::uint64_t key)
{
    key += 0x9e3779b97f4a7c15ull;
    key = (key ^ (key >> 30)) * 0xbf58476d1ce4e5b9ull;
    key = (key ^ (key >> 27)) * 0x94d049bb133111ebull;
    key ^= key >> 31;
    const double u = double(key >> 11) / double(1ull << 53);
    return kvscope::roundToDType(kvscope::DType::BFloat16, float(4.0 * u - 2.0));
}

inline std::vector<std::int64_t> tokensOf(int seed, std::int64_t n)
{
    std::vector<std::int64_t> t(static_cast<std::size_t>(n), 0);
    for (std::int64_t i = 0; i < n; ++i)
        t[std::size_t(i)] = 1000 + 37 * seed + i;
    return t;
}

// A prompt of `written` positions at physical blocks `firstBlock`, `firstBlock + stride`, ...;
// its values a function of (`seed`, layer, position, head, part, dim), rows past `written`
// zeros. Its tokens are `tokensOf(seed, written)`.
inline SidePrompt makePrompt(const TransferShape& s, const std::string& id, int seed, std::int64_t written,
                             int firstBlock, int stride = 1)
{
    SidePrompt p;
    p.id = id;
    p.tokens = tokensOf(seed, written);
    p.written = written;
    const std::int64_t entries = (written + s.blockSize - 1) / s.blockSize;
    for (std::int64_t e = 0; e < entries; ++e)
        p.physical.push_back(std::int32_t(firstBlock + stride * e));
    const std::size_t perPart = std::size_t(entries) * std::size_t(s.heads) * std::size_t(s.blockSize) * std::size_t(s.headDim);
    p.blocks.resize(std::size_t(s.layers));
    for (int l = 0; l < s.layers; ++l)
        for (int part = 0; part < 2; ++part) {
            p.blocks[std::size_t(l)][std::size_t(part)].assign(perPart, 0.0f);
            for (std::int64_t pos = 0; pos < written; ++pos)
                for (int h = 0; h < s.heads; ++h) {
                    float* r = p.position(s, l, part, pos, h);
                    for (int d = 0; d < s.headDim; ++d)
                        r[d] = transferValue((((std::uint64_t(seed) * 131 + std::uint64_t(l)) * 8191 + std::uint64_t(pos)) * 127 +
                                              std::uint64_t(h)) * 1031 + std::uint64_t(part) * 509 + std::uint64_t(d));
                }
        }
    return p;
}

inline std::string layerName(int l) { return "model.layers." + std::to_string(l) + ".self_attn"; }

inline std::string configJson(const Side& side)
{
    const TransferShape& s = side.shape;
    std::string names;
    for (int l = 0; l < s.layers; ++l)
        names += (l ? ", \"" : "\"") + layerName(l) + "\"";
    return "{\"num_blocks\": " + std::to_string(side.numBlocks) + ", \"tp_size\": " + std::to_string(s.tpSize) +
           ", \"total_num_kv_heads\": " + std::to_string(s.heads) + ", \"groups\": [{\"layer_names\": [" + names +
           "], \"spec_type\": \"FullAttentionSpec\", \"block_size\": " + std::to_string(s.blockSize) + ", \"dtype\": \"" +
           kvscope::dtypeName(side.dtype) + "\", \"num_kv_heads\": " + std::to_string(s.heads / s.tpSize) +
           ", \"head_size\": " + std::to_string(s.headDim) + "}]}";
}

// Writes `side` as an engine-only bundle: each prompt one snapshot of seq_len written + 1, its
// pool holding its own blocks (the rest zeros).
inline void writeSide(const std::string& path, const Side& side)
{
    using namespace kvscope;
    const TransferShape& s = side.shape;
    BundleMetadata metadata;
    metadata.model = s.model;
    metadata.engineOnly = true;
    BundleWriter writer(path, metadata, KvCacheConfig::fromJson(configJson(side)));
    const int perRank = s.heads / s.tpSize;
    for (const SidePrompt& p : side.prompts) {
        PromptRecord record;
        record.id = p.id;
        record.inputIds = p.tokens;
        writer.addPrompt(record);
        EngineSnapshot snap;
        snap.seqLens = {p.written + 1};
        BlockTable table;
        table.rows = 1;
        table.cols = std::int64_t(p.physical.size());
        table.entries = p.physical;
        snap.blockTables = {table};
        snap.keepOnlyReferencedBlocks = true;
        snap.ranks.resize(std::size_t(s.tpSize));
        const std::size_t rankBlock = std::size_t(perRank) * std::size_t(s.blockSize) * std::size_t(s.headDim);
        for (int l = 0; l < s.layers; ++l)
            for (int rank = 0; rank < s.tpSize; ++rank) {
                std::array<std::vector<float>, 2> pool;
                for (int part = 0; part < 2; ++part) {
                    pool[std::size_t(part)].assign(std::size_t(side.numBlocks) * rankBlock, 0.0f);
                    for (std::size_t e = 0; e < p.physical.size(); ++e)
                        for (int j = 0; j < perRank; ++j)
                            for (int r = 0; r < s.blockSize; ++r) {
                                const float* from = p.row(s, l, part, std::int64_t(e), rank * perRank + j, r);
                                std::copy_n(from, s.headDim,
                                            pool[std::size_t(part)].data() + std::size_t(p.physical[e]) * rankBlock +
                                                (std::size_t(j) * std::size_t(s.blockSize) + std::size_t(r)) * std::size_t(s.headDim));
                            }
                }
                const std::vector<std::int64_t> shape{side.numBlocks, perRank, s.blockSize, s.headDim};
                const float scale = side.scales.empty() ? 1.0f : side.scales[std::size_t(l)];
                RawTensor k = RawTensor::fromFloat(side.dtype, shape, pool[0], scale);
                RawTensor v = RawTensor::fromFloat(side.dtype, shape, pool[1], scale);
                k.scale *= side.storedScaleFactor;
                v.scale *= side.storedScaleFactor;
                snap.ranks[std::size_t(rank)][layerName(l)] = {std::move(k), std::move(v)};
            }
        writer.addSnapshot(p.id, snap);
    }
    writer.finish();
}

// A side of `count` prompts of `written` positions each, seeds 1, 2, ...; prompt i's blocks at
// `firstBlock + i * 8` on.
inline Side makeSide(const TransferShape& s, int count, std::int64_t written, int firstBlock)
{
    Side side;
    side.shape = s;
    for (int i = 0; i < count; ++i)
        side.prompts.push_back(makePrompt(s, "p" + std::to_string(i), i + 1, written, firstBlock + 8 * i));
    return side;
}

}  // namespace kvtest
