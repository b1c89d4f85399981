#pragma once
// The engine's KV cache configuration, as `get_kv_cache_config` reports it, validated.

#include "format/dtype.h"
#include "format/paged_kv.h"

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace kvscope {

enum class SpecType {
    FullAttention,
    SlidingWindow,
    ChunkedLocal,  // attention within fixed chunks (Llama 4): earlier chunks may be freed
    Mla,           // multi-head latent attention (DeepSeek): one latent per token, c_kv then k_pe
    NotCompared,   // a group kvscope does not compare (state-space layers): listed, never read
};

struct KvCacheGroup {
    std::vector<std::string> layerNames;
    SpecType specType = SpecType::FullAttention;
    std::string specName;   // the spec type as the config names it
    std::string notComparedWhy;  // NotCompared: what its layers are ("state-space layers")
    int blockSize = 0;
    std::optional<int> slidingWindow;  // counts the query token, as the model config does
    // ChunkedLocal; also given on FullAttentionSpec when vLLM's hybrid manager is off (the engine
    // then keeps every position, but the reference's cache may hold only the latest ones)
    std::optional<int> attentionChunkSize;
    DType dtype = DType::BFloat16;
    // V's format where it differs from K's (the config's `v_dtype`: "float8_e4m3fn" K beside
    // "nvfp4" V); unset: V is `dtype` too.
    std::optional<DType> vDtype;
    int numKvHeads = 0;  // per TP rank, as vLLM's spec reports it
    // Over all ranks: the group's own `total_num_kv_heads` (kvscope's field, for models whose
    // layers differ in KV head count), else the config's; 1 for MLA.
    int totalKvHeads = 0;
    int headSize = 0;
    // Mla: head_size = kv_lora_rank + qk_rope_head_dim. A bundle keeps c_kv as the layer's K and
    // k_pe as its V; `fp8_ds_mla` stores c_kv as e4m3 with a scale per 128 values, k_pe as bf16.
    int kvLoraRank = 0;
    int qkRopeHeadDim = 0;
    bool dsMla = false;

    // The width of one head of `part` as a bundle stores it (head_size but for MLA).
    int partWidth(KvPart part) const;
    // The dtype a bundle stores `part` in (dtype but for fp8_ds_mla's bf16 k_pe and a v_dtype).
    DType partDType(KvPart part) const;
    // Whether either part is quantised; and the dtype the analysis judges the layer by: K's, or
    // V's when only V is quantised.
    bool quantised() const;
    DType layerDType() const;
};

// c_kv and k_pe for an MLA group, k and v otherwise: how people call a part of `group`'s KV.
const char* partLabel(const KvCacheGroup& group, KvPart part);
// The config field that gives a part's width: head_size, or an MLA group's kv_lora_rank and
// qk_rope_head_dim (for messages).
const char* partWidthName(const KvCacheGroup& group, KvPart part);
// The values of one fp8_ds_mla token that share a scale.
inline constexpr int kDsMlaScaleGroup = 128;

// Where decode context parallelism puts one position of a group: the block-table entry (each
// covers block_size x dcp_size positions, a "virtual block"), the offset inside the physical
// block that entry names, and the DCP rank whose cache holds it. vLLM interleaves runs of
// cp_kv_cache_interleave_size positions over the DCP ranks: with 1, rank pos % dcp_size.
struct TokenSlot {
    std::int64_t entry = 0;
    int offset = 0;
    int dcpRank = 0;
};

// How the KV heads are spread over TP ranks.
enum class TpMode {
    Partitioned,  // total_num_kv_heads >= tp_size: every rank holds distinct heads
    Replicated,   // total_num_kv_heads < tp_size: groups of ranks hold the same head
};

// How one group's KV heads lie on the TP ranks (and, under DCP, which ranks share a head's
// positions). Groups may differ in head count, so each has its own.
struct TpLayout {
    int tpSize = 1;
    int totalHeads = 1;
    int dcpSize = 1;

    TpMode mode() const { return totalHeads >= tpSize ? TpMode::Partitioned : TpMode::Replicated; }
    int headsPerRank() const;
    // The ranks whose shards together hold every head once, in head order (with DCP: the
    // first rank of each head's first DCP group, which holds DCP rank 0's positions).
    std::vector<int> contributingRanks() const;
    // Every shard the analysis reads: each contributing rank and the rest of its DCP group.
    std::vector<int> ranksRead() const;
    // Every rank that holds head `head` (one when partitioned, its copies when replicated), at
    // any position.
    std::vector<int> ranksHolding(int head) const;
    // Those of them that hold its positions of DCP rank `dcpRank`.
    std::vector<int> ranksHolding(int head, int dcpRank) const;
    // The total head held as head j (0 <= j < headsPerRank()) of `rank`.
    int headOnRank(int rank, int j) const;
};

struct KvCacheConfig {
    int numBlocks = 0;
    std::vector<KvCacheGroup> groups;
    int tpSize = 1;
    int totalNumKvHeads = 0;  // the model's, as the config gives it; each group's is KvCacheGroup::totalKvHeads
    // Decode context parallelism: the ranks holding one head (its TP replicas) split its
    // positions in consecutive groups of dcpSize ranks (vLLM's DCP groups: ranks 0..dcp-1, ...).
    int dcpSize = 1;
    int cpInterleave = 1;  // cp_kv_cache_interleave_size
    std::string json;  // the text it was parsed from, kept verbatim

    // Parses and validates; `file` and `object` name the source for error messages.
    static KvCacheConfig fromJson(const std::string& text, const std::string& file = {},
                                  const std::string& object = "kv_cache_config");
    // The engine's dict form (as get_kv_cache_config returns it).
    std::string toJson() const;

    // How `group`'s heads lie on the ranks; layoutOf(layer) for a layer's group (the first
    // compared group's for a layer of none).
    TpLayout layout(const KvCacheGroup& group) const { return {tpSize, group.totalKvHeads, dcpSize}; }
    TpLayout layoutOf(const std::string& layer) const;
    // The most KV heads any compared group has: the head axis of an analysis.
    int maxKvHeads() const;
    int dcpRankOf(int tpRank) const { return tpRank % dcpSize; }
    // The positions one block-table entry of `group` covers: block_size x dcp_size.
    std::int64_t positionsPerEntry(const KvCacheGroup& group) const
    {
        return std::int64_t(group.blockSize) * dcpSize;
    }
    TokenSlot slotOf(const KvCacheGroup& group, std::int64_t pos) const;

    // Index of the group holding `layer`, or -1.
    int groupOf(const std::string& layer) const;
    // Every compared layer, ordered by the first number in its name (layers.2 before layers.10).
    std::vector<std::string> layerNames() const;
    // Every layer of the config, compared or not, in model order (HF caches hold them all).
    std::vector<std::string> allLayerNames() const;
    // Whether `layer` belongs to a group kvscope compares.
    bool isCompared(const std::string& layer) const;
    // The layers of groups kvscope does not compare, in the same order, with what they are.
    std::vector<std::pair<std::string, std::string>> notComparedLayers() const;
    // The first compared group.
    const KvCacheGroup& firstCompared() const;
    // Whether the compared groups are MLA (kvscope does not mix MLA and other attention).
    bool isMla() const { return firstCompared().specType == SpecType::Mla; }
};

std::string specTypeName(SpecType type);
// A dtype as a config's group writes it: vLLM's "nvfp4" and "int4_per_token_head", else torch's
// spelling ("torch.bfloat16").
std::string configDTypeName(DType dtype);
// The first number in a layer's name (model.layers.12.self_attn: 12), or -1.
long long layerNumber(const std::string& layer);
// How a group's heads lie on the ranks, for people: "partitioned, 2 head(s) per rank, 8 KV heads".
std::string describeHeads(const TpLayout& layout);
// Decode context parallelism for people: "DCP 2: each group of 2 ranks holding a head splits its
// positions, in runs of 1 (...)", or empty without it.
std::string describeContextParallel(const KvCacheConfig& config);
// One line for people: "SlidingWindowSpec (sliding_window 4096), block_size 16, bfloat16, 24 layers,
// head_size 128", or "MambaSpec, 24 layers, not compared (state-space layers)".
std::string describeGroup(const KvCacheGroup& group);
// The layers a config does not compare, one line per kind: "state-space layers (3): model.layers.1.mixer,
// model.layers.2.mixer, model.layers.3.mixer" (the first six names, then "...").
std::vector<std::string> describeNotCompared(const std::vector<std::pair<std::string, std::string>>& layers);

}  // namespace kvscope
