#include "quant/whatif_json.h"

#include "util/json_writer.h"

namespace kvscope {

namespace {

void writeRecipe(JsonWriter& w, const ImpactRecipe& recipe)
{
    w.beginObject().field("budget", recipe.budgetRule).key("schemes").array(recipe.schemes.size(), [&](std::size_t i) {
        const SchemeImpact& s = recipe.schemes[i];
        w.beginObject()
            .field("name", s.scheme.name())
            .field("vllm_kv_cache_dtype", s.vllmDtype.empty() ? std::optional<std::string>() : s.vllmDtype)
            .field("bits_per_value", s.bitsPerValue)
            .key("keep_in_bf16").strings(s.keep)
            .key("layers").array(s.layers.size(), [&](std::size_t l) {
                const SchemeLayerImpact& x = s.layers[l];
                w.beginObject().field("layer", x.layer).key("kl");
                writeImpactFigures(w, x.kl);
                w.key("noise");
                writeImpactFigures(w, x.noise);
                w.field("budget", x.budget).field("within", x.within).endObject();
            });
        w.endObject();
    });
    w.field("arguments", recipe.arguments.empty() ? std::optional<std::string>() : recipe.arguments)
        .field("text", recipe.text)
        .endObject();
}

}  // namespace

void writeWhatIfJson(const WhatIfResult& r, std::ostream& out, bool maps, const ImpactRecipe* impact)
{
    JsonWriter w(out);
    w.beginObject();
    w.key("bundle").value(r.bundle);
    w.key("floor").value(r.floor);
    w.key("bf16_floor_rel_l2_median").beginObject().key("k").value(r.bf16FloorMedian[0]).key("v").value(r.bf16FloorMedian[1]).endObject();
    w.key("prompts").beginArray();
    for (std::size_t i = 0; i < r.promptIds.size(); ++i)
        w.beginObject().key("id").value(r.promptIds[i]).key("tokens").value(r.promptTokens[i]).endObject();
    w.endArray();
    w.key("layers").beginArray();
    for (const std::string& l : r.layers)
        w.value(l);
    w.endArray();
    w.key("schemes").beginArray();
    for (const WhatIfScheme& s : r.schemes) {
        w.beginObject();
        w.key("name").value(s.scheme.name());
        w.key("description").value(s.scheme.description());
        w.key("bits").value(s.scheme.bits());
        w.key("typical_floor_ratio").value(s.typicalRatio);
        w.key("typical_worst_head_rel_l2").value(s.typicalWorstHead);
        w.key("verdict").value(s.verdict);
        w.key("hurt_layers").beginArray();
        for (const WhatIfLayer& l : s.layers)
            if (l.hurt)
                w.value(l.layer);
        w.endArray();
        w.key("layers").beginArray();
        for (const WhatIfLayer& l : s.layers) {
            w.beginObject();
            w.key("layer").value(l.layer);
            w.key("k_rel_l2_median").value(l.relL2Median[0]);
            w.key("v_rel_l2_median").value(l.relL2Median[1]);
            w.key("k_floor_ratio_median").value(l.floorRatioMedian[0]);
            w.key("v_floor_ratio_median").value(l.floorRatioMedian[1]);
            w.key("k_floor_ratio_p90").value(l.floorRatioP90[0]);
            w.key("v_floor_ratio_p90").value(l.floorRatioP90[1]);
            w.key("k_worst_head").value(l.worstHead[0]).key("k_worst_head_rel_l2").value(l.worstHeadRelL2[0]);
            w.key("v_worst_head").value(l.worstHead[1]).key("v_worst_head_rel_l2").value(l.worstHeadRelL2[1]);
            w.key("k_saturated").value(l.saturated[0]);
            w.key("v_saturated").value(l.saturated[1]);
            w.key("k_outlier_channel").value(l.kOutlierChannel);
            w.key("hurt").value(l.hurt);
            w.key("worst_cells").beginArray();
            for (const WhatIfCell& c : l.worst)
                w.beginObject()
                    .key("prompt").value(c.prompt)
                    .key("token").value(c.token)
                    .key("head").value(c.head)
                    .key("kv").value(kvPartName(c.part))
                    .key("rel_l2").value(c.relL2)
                    .key("floor_ratio").value(c.floorRatio)
                    .endObject();
            w.endArray();
            w.endObject();
        }
        w.endArray();
        if (maps) {
            w.key("maps").beginArray();
            for (std::size_t p = 0; p < s.maps.size(); ++p) {
                w.beginObject().key("prompt").value(r.promptIds[p]);
                w.key("k").floats(s.maps[p][0].data(), s.maps[p][0].size());
                w.key("v").floats(s.maps[p][1].data(), s.maps[p][1].size());
                w.endObject();
            }
            w.endArray();
        }
        w.endObject();
    }
    w.endArray();
    if (impact)
        writeRecipe(w.key("impact"), *impact);
    w.key("problems").beginArray();
    for (const std::string& p : r.problems)
        w.value(p);
    w.endArray();
    w.endObject();
    out << "\n";
}

}  // namespace kvscope
