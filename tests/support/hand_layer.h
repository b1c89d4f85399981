#pragma once
// The hand-made layer the hypothesis suites share: one bf16 full-attention layer of 4 KV heads
// of 8 (over TP 2, blocks of 4) and 24 tokens, its reference random; each test makes the
// engine side by transforming it.

#include "analysis/analysis_result.h"
#include "format/kv_cache_config.h"
#include "kv/layer_kv.h"

#include <algorithm>
#include <cstdint>
#include <random>

namespace kvtest::hand {

constexpr int kHeads = 4, kDim = 8, kTokens = 24;

inline kvscope::KvCacheConfig config()
{
    return kvscope::KvCacheConfig::fromJson(R"({"num_blocks": 16, "tp_size": 2, "total_num_kv_heads": 4, "groups": [
        {"layer_names": ["l0"], "spec_type": "FullAttentionSpec", "block_size": 4, "dtype": "torch.bfloat16",
         "num_kv_heads": 2, "head_size": 8}]})");
}

// A reference layer of random vectors.
inline kvscope::LayerKv randomLayer(std::uint64_t seed)
{
    kvscope::LayerKv kv = kvscope::LayerKv::unwritten(kHeads, kTokens, kDim);
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> normal;
    for (float& x : kv.k)
        x = normal(rng);
    for (float& x : kv.v)
        x = normal(rng);
    kv.present.assign(kTokens, 1);
    return kv;
}

// A two-way prompt of that one bf16 layer (its floors 2^-8), every metric 0: a test sets the cells
// it is about.
inline kvscope::PromptAnalysis twoWayPrompt()
{
    kvscope::PromptAnalysis p;
    p.id = std::string(1, 'p');  // (GCC 12 warns falsely of an overlap for a literal here)
    p.promptLen = 16;
    p.tokens = kTokens;
    p.heads = kHeads;
    p.dims = kDim;
    p.layers = {"l0"};
    p.layerGroups = {0};
    p.layerDtypes = {kvscope::DType::BFloat16};
    p.allocate();
    for (auto& m : p.metrics)
        std::fill(m.begin(), m.end(), 0.0f);
    return p;
}

}  // namespace kvtest::hand
