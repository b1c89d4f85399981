#include "format/kv_cache_config.h"

#include "format/bundle_error.h"
#include "util/json_writer.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cctype>
#include <set>

namespace kvscope {

using Json = nlohmann::json;

namespace {

// Limits well beyond any real model; they keep absurd declared sizes from reaching allocations.
constexpr int kMaxBlocks = 1 << 26;
constexpr int kMaxBlockSize = 1 << 16;
constexpr int kMaxHeads = 1 << 12;
constexpr int kMaxHeadSize = 1 << 14;
constexpr int kMaxTp = 1 << 12;

struct Context {
    const std::string& file;
    const std::string& object;
    [[noreturn]] void fail(const std::string& where, const std::string& problem) const
    {
        throw BundleError(file, where.empty() ? object : object + "." + where, problem);
    }
};

int requireInt(const Json& obj, const char* key, int lo, int hi, const Context& ctx,
               const std::string& where)
{
    const std::string path = where.empty() ? key : where + "." + key;
    if (!obj.contains(key))
        ctx.fail(path, "missing");
    const Json& v = obj.at(key);
    if (!v.is_number_integer())
        ctx.fail(path, "must be an integer, got " + jsonText(v));
    const auto value = v.get<long long>();
    if (value < lo || value > hi)
        ctx.fail(path, "value " + std::to_string(value) + " outside [" + std::to_string(lo) + ", " +
                           std::to_string(hi) + "]");
    return int(value);
}

int optionalInt(const Json& obj, const char* key, int fallback, const Context& ctx)
{
    if (!obj.contains(key) || obj.at(key).is_null())
        return fallback;
    return requireInt(obj, key, 0, kMaxTp, ctx, {});
}

}  // namespace

std::string specTypeName(SpecType type)
{
    return type == SpecType::SlidingWindow ? "SlidingWindowSpec" : "FullAttentionSpec";
}

KvCacheConfig KvCacheConfig::fromJson(const std::string& text, const std::string& file,
                                      const std::string& object)
{
    const Context ctx{file, object};
    Json root;
    try {
        root = Json::parse(text);
    } catch (const Json::exception& e) {  // parse errors, and numbers out of range (1e999)
        ctx.fail({}, std::string("not valid JSON: ") + e.what());
    }
    if (!root.is_object())
        ctx.fail({}, "must be a JSON object");

    KvCacheConfig cfg;
    cfg.json = text;
    cfg.numBlocks = requireInt(root, "num_blocks", 1, kMaxBlocks, ctx, {});
    cfg.tpSize = requireInt(root, "tp_size", 1, kMaxTp, ctx, {});
    cfg.totalNumKvHeads = requireInt(root, "total_num_kv_heads", 1, kMaxHeads, ctx, {});
    for (const char* cp : {"dcp_size", "pcp_size"})
        if (optionalInt(root, cp, 1, ctx) > 1)
            ctx.fail(cp, "context parallelism (> 1) is not supported");

    if (cfg.totalNumKvHeads >= cfg.tpSize && cfg.totalNumKvHeads % cfg.tpSize != 0)
        ctx.fail("total_num_kv_heads", std::to_string(cfg.totalNumKvHeads) +
                                           " heads cannot be partitioned over tp_size " +
                                           std::to_string(cfg.tpSize));
    if (cfg.totalNumKvHeads < cfg.tpSize && cfg.tpSize % cfg.totalNumKvHeads != 0)
        ctx.fail("total_num_kv_heads", std::to_string(cfg.totalNumKvHeads) +
                                           " heads cannot be replicated evenly over tp_size " +
                                           std::to_string(cfg.tpSize));

    if (!root.contains("groups") || !root["groups"].is_array() || root["groups"].empty())
        ctx.fail("groups", "must be a non-empty list");
    std::set<std::string> seen;
    for (std::size_t g = 0; g < root["groups"].size(); ++g) {
        const std::string where = "groups[" + std::to_string(g) + "]";
        const Json& jg = root["groups"][g];
        if (!jg.is_object())
            ctx.fail(where, "must be an object");
        KvCacheGroup group;

        if (!jg.contains("layer_names") || !jg["layer_names"].is_array() || jg["layer_names"].empty())
            ctx.fail(where + ".layer_names", "must be a non-empty list of strings");
        for (const Json& name : jg["layer_names"]) {
            if (!name.is_string() || name.get<std::string>().empty())
                ctx.fail(where + ".layer_names", "holds a non-string or empty entry " + jsonText(name));
            const std::string s = name.get<std::string>();
            if (s.find('/') != std::string::npos || s == "." || s == "..")
                ctx.fail(where + ".layer_names", "layer name '" + s + "' cannot be an HDF5 name");
            if (!seen.insert(s).second)
                ctx.fail(where + ".layer_names", "layer '" + s + "' appears in more than one place");
            group.layerNames.push_back(s);
        }

        if (!jg.contains("spec_type") || !jg["spec_type"].is_string())
            ctx.fail(where + ".spec_type", "missing or not a string");
        const std::string spec = jg["spec_type"].get<std::string>();
        if (spec == "FullAttentionSpec")
            group.specType = SpecType::FullAttention;
        else if (spec == "SlidingWindowSpec")
            group.specType = SpecType::SlidingWindow;
        else
            ctx.fail(where + ".spec_type", "'" + spec + "' is not supported (supported: "
                                           "FullAttentionSpec, SlidingWindowSpec)");

        group.blockSize = requireInt(jg, "block_size", 1, kMaxBlockSize, ctx, where);
        group.numKvHeads = requireInt(jg, "num_kv_heads", 1, kMaxHeads, ctx, where);
        group.headSize = requireInt(jg, "head_size", 1, kMaxHeadSize, ctx, where);
        if (jg.contains("sliding_window") && !jg["sliding_window"].is_null())
            group.slidingWindow = requireInt(jg, "sliding_window", 1, 1 << 30, ctx, where);
        if (group.specType == SpecType::SlidingWindow && !group.slidingWindow)
            ctx.fail(where + ".sliding_window", "SlidingWindowSpec needs a sliding_window");

        if (!jg.contains("dtype") || !jg["dtype"].is_string())
            ctx.fail(where + ".dtype", "missing or not a string");
        const auto dtype = parseDType(jg["dtype"].get<std::string>());
        if (!dtype)
            ctx.fail(where + ".dtype", "unsupported dtype '" + jg["dtype"].get<std::string>() +
                                           "' (supported: bfloat16, float16, float32, "
                                           "float8_e4m3fn, float8_e5m2)");
        group.dtype = *dtype;

        if (group.numKvHeads != cfg.headsPerRank())
            ctx.fail(where + ".num_kv_heads",
                     std::to_string(group.numKvHeads) + " per rank disagrees with total_num_kv_heads " +
                         std::to_string(cfg.totalNumKvHeads) + " over tp_size " +
                         std::to_string(cfg.tpSize) + " (expected " +
                         std::to_string(cfg.headsPerRank()) + ")");
        if (g > 0 && group.headSize != cfg.groups.front().headSize)
            ctx.fail(where + ".head_size", "differs from groups[0]");
        cfg.groups.push_back(std::move(group));
    }
    return cfg;
}

std::string KvCacheConfig::toJson() const
{
    Json root;
    root["num_blocks"] = numBlocks;
    root["tp_size"] = tpSize;
    root["total_num_kv_heads"] = totalNumKvHeads;
    root["dcp_size"] = 1;
    root["pcp_size"] = 1;
    root["groups"] = Json::array();
    for (const KvCacheGroup& g : groups) {
        Json jg;
        jg["layer_names"] = g.layerNames;
        jg["spec_type"] = specTypeName(g.specType);
        jg["block_size"] = g.blockSize;
        jg["sliding_window"] = g.slidingWindow ? Json(*g.slidingWindow) : Json(nullptr);
        jg["dtype"] = "torch." + dtypeName(g.dtype);
        jg["num_kv_heads"] = g.numKvHeads;
        jg["head_size"] = g.headSize;
        root["groups"].push_back(jg);
    }
    return jsonText(root);
}

TpMode KvCacheConfig::tpMode() const
{
    return totalNumKvHeads >= tpSize ? TpMode::Partitioned : TpMode::Replicated;
}

int KvCacheConfig::headsPerRank() const
{
    return std::max(1, totalNumKvHeads / tpSize);
}

std::vector<int> KvCacheConfig::contributingRanks() const
{
    std::vector<int> ranks;
    const int stride = tpMode() == TpMode::Partitioned ? 1 : tpSize / totalNumKvHeads;
    for (int r = 0; r < tpSize; r += stride)
        ranks.push_back(r);
    return ranks;
}

std::vector<int> KvCacheConfig::ranksHolding(int head) const
{
    if (tpMode() == TpMode::Partitioned)
        return {head / headsPerRank()};
    const int stride = tpSize / totalNumKvHeads;
    std::vector<int> ranks;
    for (int r = head * stride; r < (head + 1) * stride; ++r)
        ranks.push_back(r);
    return ranks;
}

int KvCacheConfig::headOnRank(int rank, int j) const
{
    return tpMode() == TpMode::Partitioned ? rank * headsPerRank() + j : rank / (tpSize / totalNumKvHeads);
}

int KvCacheConfig::groupOf(const std::string& layer) const
{
    for (std::size_t g = 0; g < groups.size(); ++g)
        for (const std::string& name : groups[g].layerNames)
            if (name == layer)
                return int(g);
    return -1;
}

static long long firstNumber(const std::string& s)
{
    const auto it = std::find_if(s.begin(), s.end(), [](unsigned char c) { return std::isdigit(c); });
    if (it == s.end())
        return -1;
    long long n = 0;
    for (auto p = it; p != s.end() && std::isdigit(static_cast<unsigned char>(*p)) && n < (1LL << 40); ++p)
        n = n * 10 + (*p - '0');
    return n;
}

std::vector<std::string> KvCacheConfig::layerNames() const
{
    std::vector<std::string> names;
    for (const KvCacheGroup& g : groups)
        names.insert(names.end(), g.layerNames.begin(), g.layerNames.end());
    std::stable_sort(names.begin(), names.end(), [](const std::string& a, const std::string& b) {
        const long long na = firstNumber(a), nb = firstNumber(b);
        return na != nb ? na < nb : a < b;
    });
    return names;
}

}  // namespace kvscope
