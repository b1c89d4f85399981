#pragma once
// What-if by impact: where a bundle measured what each scheme's quantised KV does to the
// reference's next-token distribution (format/impact_record.h, `scheme` rows), each scheme's KL
// per layer against what bf16 noise does there (the `baseline` rows), and a recipe for vLLM: the
// cheapest cache dtype vLLM offers whose KL is within the budget on as many layers as make it
// cheapest, the others kept in the model's dtype (--kv-cache-dtype-skip-layers).

#include "format/impact_record.h"
#include "quant/quant_scheme.h"

#include <optional>
#include <string>
#include <vector>

namespace kvscope {

// One layer under one scheme: the KL (median and max over decode steps), the noise's, the
// budget it was held to and whether it stays within it.
struct SchemeLayerImpact {
    std::string layer;
    ImpactFigures kl;
    std::optional<ImpactFigures> noise;
    double budget = 0;  // nats, on the median over steps
    bool within = false;
};

struct SchemeImpact {
    QuantScheme scheme;
    std::string vllmDtype;  // its --kv-cache-dtype (empty: vLLM has no such cache)
    std::vector<std::string> vllmExtra;  // further arguments it needs (fp8_e4m3/vllm: --calculate-kv-scales)
    std::vector<SchemeLayerImpact> layers;  // every layer the records measured, in the given order
    std::vector<std::string> keep;          // layers beyond the budget: kept in the model's dtype
    double bitsPerValue = 16;               // the cache's average over layers, those kept at 16
};

struct ImpactRecipe {
    std::string budgetRule;  // "twice the layer's bf16 noise (median KL over decode steps)" or "0.001 nats ..."
    std::vector<SchemeImpact> schemes;  // those the records measured, in the given order
    std::optional<std::size_t> chosen;  // the cheapest with a vLLM dtype (nullopt: none)
    std::string arguments;  // "--kv-cache-dtype fp8_e4m3 --kv-cache-dtype-skip-layers 0 23"
    std::string text;       // one line: the recipe and why
};

// Scores `schemes` over `records` (each prompt's) on `layers` (model order). klBudget: nats on a
// layer's median KL over steps. Without it, a layer is within when its KL over its bf16 noise (its
// `baseline` row) is at most 10, and at most twice the median of that ratio over the layers (the
// layers a scheme hurts much more than the rest); a layer without a noise row is then kept.
ImpactRecipe proposeRecipe(const std::vector<const ImpactRecord*>& records, const std::vector<std::string>& layers,
                           const std::vector<QuantScheme>& schemes, std::optional<double> klBudget = std::nullopt);

// The schemes whose impact the records measured (their `scheme` rows), in the order first met.
std::vector<QuantScheme> measuredSchemes(const std::vector<const ImpactRecord*>& records);
// proposeRecipe for the schemes the records measured; nullopt when they measured none.
std::optional<ImpactRecipe> recipeForMeasured(const std::vector<const ImpactRecord*>& records,
                                              const std::vector<std::string>& layers,
                                              std::optional<double> klBudget = std::nullopt);

// vLLM's --kv-cache-dtype for a scheme (empty: none), and the arguments it also needs.
std::string vllmKvCacheDtype(const QuantScheme& scheme, std::vector<std::string>* extra = nullptr);
// The layer index vLLM's --kv-cache-dtype-skip-layers takes (the one integer in the name,
// "model.layers.23.self_attn" -> 23); nullopt when the name holds none or several.
std::optional<int> vllmLayerIndex(const std::string& layer);

}  // namespace kvscope
