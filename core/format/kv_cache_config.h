#pragma once
// The engine's KV cache configuration, as `get_kv_cache_config` reports it, validated.

#include "format/dtype.h"

#include <optional>
#include <string>
#include <vector>

namespace kvscope {

enum class SpecType { FullAttention, SlidingWindow };

struct KvCacheGroup {
    std::vector<std::string> layerNames;
    SpecType specType = SpecType::FullAttention;
    int blockSize = 0;
    std::optional<int> slidingWindow;  // counts the query token, as the model config does
    DType dtype = DType::BFloat16;
    int numKvHeads = 0;  // per TP rank, as vLLM's spec reports it
    int headSize = 0;
};

// How the KV heads are spread over TP ranks.
enum class TpMode {
    Partitioned,  // total_num_kv_heads >= tp_size: every rank holds distinct heads
    Replicated,   // total_num_kv_heads < tp_size: groups of ranks hold the same head
};

struct KvCacheConfig {
    int numBlocks = 0;
    std::vector<KvCacheGroup> groups;
    int tpSize = 1;
    int totalNumKvHeads = 0;
    std::string json;  // the text it was parsed from, kept verbatim

    // Parses and validates; `file` and `object` name the source for error messages.
    static KvCacheConfig fromJson(const std::string& text, const std::string& file = {},
                                  const std::string& object = "kv_cache_config");
    // The engine's dict form (as get_kv_cache_config returns it).
    std::string toJson() const;

    TpMode tpMode() const;
    int headsPerRank() const;
    // The ranks whose shards together hold every head once, in head order.
    std::vector<int> contributingRanks() const;
    // Every rank that holds head `head` (one when partitioned, its copies when replicated).
    std::vector<int> ranksHolding(int head) const;
    // The total head held as head j (0 <= j < headsPerRank()) of `rank`.
    int headOnRank(int rank, int j) const;

    // Index of the group holding `layer`, or -1.
    int groupOf(const std::string& layer) const;
    // Every layer, ordered by the first number in its name (layers.2 before layers.10).
    std::vector<std::string> layerNames() const;
};

std::string specTypeName(SpecType type);

}  // namespace kvscope
