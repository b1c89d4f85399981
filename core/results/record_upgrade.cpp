#include "results/record_upgrade.h"

#include <string>

namespace kvscope {

namespace {

using Json = JsonFields::Json;

void rename(Json& o, const char* from, const char* to)
{
    if (!o.is_object() || !o.contains(from))
        return;
    Json value = std::move(o[from]);
    o.erase(from);
    o[to] = std::move(value);
}

// A pair [k, v] (format 2: [[k...], [v...]], [head_dim, v_head_dim]) as two fields.
void splitPair(Json& o, const char* from, const std::string& k, const std::string& v)
{
    if (!o.is_object() || !o.contains(from))
        return;
    Json pair = std::move(o[from]);
    o.erase(from);
    if (pair.is_array() && pair.size() == 2) {
        o[k] = std::move(pair[0]);
        o[v] = std::move(pair[1]);
    } else {
        o[k] = std::move(pair);  // (not a pair: the reader names the field)
    }
}

// Format 1's [layer * generation index] values as rows by layer.
void rowsByLayer(Json& a, const std::string& key, std::size_t layers, std::size_t generations)
{
    if (!a.contains(key) || !a[key].is_array() || a[key].size() != layers * generations)
        return;
    Json rows = Json::array();
    for (std::size_t l = 0; l < layers; ++l) {
        Json row = Json::array();
        for (std::size_t g = 0; g < generations; ++g)
            row.push_back(a[key][l * generations + g]);
        rows.push_back(std::move(row));
    }
    a[key] = std::move(rows);
}

void upgradePrompt(Json& p)
{
    if (!p.is_object())
        return;
    rename(p, "tokens", "num_tokens");
    rename(p, "heads", "num_heads");
    rename(p, "layers", "layer_names");
    rename(p, "layer_dims", "layer_head_dims");
    splitPair(p, "dims", "head_dim", "v_head_dim");
    if (p.contains("three_way") && p["three_way"].is_boolean())
        p["mode"] = p["three_way"].get<bool>() ? "three-way" : "two-way";
    p.erase("three_way");
    if (p.contains("reference_fingerprints") && p["reference_fingerprints"].is_array() &&
        p["reference_fingerprints"].size() == 2) {
        Json& hashes = p["reference_fingerprints"];
        hashes = Json{{"expected", hashes[0]}, {"baseline", hashes[1]}};
    }
}

void upgradeAggregate(Json& a)
{
    if (!a.is_object())
        return;
    rename(a, "layers", "layer_names");
    rename(a, "generation_count", "num_generation_indices");
    splitPair(a, "combined", "combined_k_bc", "combined_v_bc");
    splitPair(a, "combined_vs_noise", "combined_k_bc_vs_noise", "combined_v_bc_vs_noise");
    splitPair(a, "bc", "k_bc", "v_bc");  // format 1 only
    splitPair(a, "bc_vs_noise", "k_bc_vs_noise", "v_bc_vs_noise");
    const Json layers = a.value("layer_names", Json()), generations = a.value("num_generation_indices", Json());
    if (layers.is_array() && generations.is_number_unsigned() && generations.get<std::uint64_t>() <= (1u << 24))
        for (const char* key : {"k_bc", "v_bc", "k_bc_vs_noise", "v_bc_vs_noise"})
            rowsByLayer(a, key, layers.size(), generations.get<std::size_t>());
}

}  // namespace

void upgradeRecordToV3(Json& record, int formatVersion)
{
    if (formatVersion >= 3 || !record.is_object())
        return;
    if (record.contains("not_compared") && record["not_compared"].is_array())
        for (Json& pair : record["not_compared"])
            if (pair.is_array() && pair.size() == 2)
                pair = Json{{"layer", std::move(pair[0])}, {"what", std::move(pair[1])}};
    if (record.contains("prompts") && record["prompts"].is_array())
        for (Json& p : record["prompts"])
            upgradePrompt(p);
    if (record.contains("aggregate"))
        upgradeAggregate(record["aggregate"]);
}

}  // namespace kvscope
