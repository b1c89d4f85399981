#include "quant/impact_recipe.h"

#include <algorithm>
#include <cctype>
#include <cstdio>

namespace kvscope {

namespace {

// Without a budget given, a layer keeps bf16 when the scheme's KL there is more than ten times what
// bf16 noise does in it (an order of magnitude beyond what the bf16 reference already is), or more
// than twice the model's typical layer's ratio under the same scheme (the layers it hurts much
// more than the rest, the what-if's own rule, by output).
constexpr double kNoiseCap = 10.0;
constexpr double kTypicalFactor = 2.0;

double median(std::vector<double> v)
{
    std::sort(v.begin(), v.end());
    const std::size_t n = v.size();
    return n == 0 ? 0 : n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

std::string nats(double kl)
{
    char text[32];
    std::snprintf(text, sizeof text, "%.2g", kl);
    return text;
}

}  // namespace

std::vector<QuantScheme> measuredSchemes(const std::vector<const ImpactRecord*>& records)
{
    std::vector<QuantScheme> out;
    for (const ImpactRecord* r : records)
        for (const Transplant& t : r->transplants) {
            std::string error;
            const std::optional<QuantScheme> s = t.kind == TransplantKind::Scheme ? parseScheme(t.scheme, error) : std::nullopt;
            if (s && std::none_of(out.begin(), out.end(), [&](const QuantScheme& o) { return o.name() == s->name(); }))
                out.push_back(*s);
        }
    return out;
}

std::optional<ImpactRecipe> recipeForMeasured(const std::vector<const ImpactRecord*>& records,
                                              const std::vector<std::string>& layers, std::optional<double> klBudget)
{
    const std::vector<QuantScheme> measured = measuredSchemes(records);
    if (measured.empty())
        return std::nullopt;
    return proposeRecipe(records, layers, measured, klBudget);
}

std::string vllmKvCacheDtype(const QuantScheme& s, std::vector<std::string>* extra)
{
    using F = QuantScheme::Format;
    using S = QuantScheme::Scaling;
    if (extra)
        extra->clear();
    if (s.format == F::Fp8E4M3 && s.scaling == S::Tensor)
        return "fp8_e4m3";  // a per-tensor scale from the checkpoint
    if (s.format == F::Fp8E4M3 && s.scaling == S::VllmStatic) {
        if (extra)
            extra->push_back("--calculate-kv-scales");
        return "fp8_e4m3";
    }
    if (s.format == F::Fp8E5M2 && s.scaling == S::Tensor)
        return "fp8_e5m2";
    if (s.format == F::Int4 && s.scaling == S::TokenHeadRht)
        return "int4_per_token_head";
    if (s.format == F::Nvfp4 && s.scaling == S::Block16)
        return "nvfp4";
    return {};
}

std::optional<int> vllmLayerIndex(const std::string& layer)
{
    std::optional<int> index;
    for (std::size_t i = 0; i < layer.size();) {
        if (!std::isdigit(static_cast<unsigned char>(layer[i]))) {
            ++i;
            continue;
        }
        std::size_t end = i;
        while (end < layer.size() && std::isdigit(static_cast<unsigned char>(layer[end])))
            ++end;
        if (index)
            return std::nullopt;  // vLLM's extract_layer_index refuses several
        index = std::stoi(layer.substr(i, end - i));
        i = end;
    }
    return index;
}

ImpactRecipe proposeRecipe(const std::vector<const ImpactRecord*>& records, const std::vector<std::string>& layers,
                           const std::vector<QuantScheme>& schemes, std::optional<double> klBudget)
{
    ImpactRecipe recipe;
    recipe.budgetRule = klBudget ? nats(*klBudget) + " nats on a layer's median KL over decode steps"
                                 : "a layer's median KL over decode steps within 10x its bf16 noise (the baseline's KV "
                                   "there) and within twice the typical layer's ratio to its noise";
    for (const QuantScheme& scheme : schemes) {
        SchemeImpact s;
        s.scheme = scheme;
        s.vllmDtype = vllmKvCacheDtype(scheme, &s.vllmExtra);
        std::vector<double> ratios;  // each layer's KL over its noise
        for (const std::string& layer : layers) {
            const std::optional<ImpactFigures> kl = impactFigures(records, {TransplantKind::Scheme, layer, scheme.name()});
            if (!kl)
                continue;
            SchemeLayerImpact l;
            l.layer = layer;
            l.kl = *kl;
            l.noise = impactFigures(records, {TransplantKind::Baseline, layer, {}});
            if (l.noise && l.noise->klMedian > 0)
                ratios.push_back(l.kl.klMedian / l.noise->klMedian);
            s.layers.push_back(std::move(l));
        }
        if (s.layers.empty())
            continue;
        const double factor = std::min(kNoiseCap, kTypicalFactor * std::max(median(ratios), 1.0));
        double bits = 0;
        for (SchemeLayerImpact& l : s.layers) {
            const bool judged = klBudget || l.noise;
            l.budget = klBudget ? *klBudget : l.noise ? factor * l.noise->klMedian : 0;
            l.within = judged && l.kl.klMedian <= l.budget;
            if (!l.within)
                s.keep.push_back(l.layer);
            bits += l.within ? scheme.bits() : 16;
        }
        s.bitsPerValue = bits / double(s.layers.size());
        recipe.schemes.push_back(std::move(s));
    }
    for (std::size_t i = 0; i < recipe.schemes.size(); ++i) {
        const SchemeImpact& s = recipe.schemes[i];
        if (s.vllmDtype.empty() || s.keep.size() == s.layers.size())
            continue;
        bool expressible = true;
        for (const std::string& layer : s.keep)
            expressible = expressible && vllmLayerIndex(layer).has_value();
        if (!expressible)
            continue;
        if (!recipe.chosen || s.bitsPerValue < recipe.schemes[*recipe.chosen].bitsPerValue)
            recipe.chosen = i;
    }
    if (!recipe.chosen) {
        recipe.text = recipe.schemes.empty()
                          ? "no scheme's impact was measured (the bundle's impact record has no scheme rows)"
                          : "no cache dtype vLLM offers keeps any layer within the budget (" + recipe.budgetRule + "): keep bf16";
        return recipe;
    }
    const SchemeImpact& s = recipe.schemes[*recipe.chosen];
    recipe.arguments = "--kv-cache-dtype " + s.vllmDtype;
    for (const std::string& extra : s.vllmExtra)
        recipe.arguments += " " + extra;
    if (!s.keep.empty()) {
        recipe.arguments += " --kv-cache-dtype-skip-layers";
        for (const std::string& layer : s.keep)
            recipe.arguments += " " + std::to_string(*vllmLayerIndex(layer));
    }
    char share[32];
    std::snprintf(share, sizeof share, "%.0f%%", 100.0 * s.bitsPerValue / 16.0);
    recipe.text = recipe.arguments + ": " + s.scheme.description() + " on " +
                  std::to_string(s.layers.size() - s.keep.size()) + " of " + std::to_string(s.layers.size()) +
                  " layers, " + std::to_string(s.keep.size()) + " kept in bf16 (" + share +
                  " of a bf16 cache); budget: " + recipe.budgetRule;
    return recipe;
}

}  // namespace kvscope
