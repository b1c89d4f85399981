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
    switch (type) {
    case SpecType::FullAttention: return "FullAttentionSpec";
    case SpecType::SlidingWindow: return "SlidingWindowSpec";
    case SpecType::ChunkedLocal: return "ChunkedLocalAttentionSpec";
    case SpecType::Mla: return "MLAAttentionSpec";
    case SpecType::NotCompared: break;
    }
    return "NotCompared";
}

std::string describeHeads(const TpLayout& layout)
{
    return std::string(layout.mode() == TpMode::Partitioned ? "partitioned" : "replicated") + ", " +
           std::to_string(layout.headsPerRank()) + " head(s) per rank, " + std::to_string(layout.totalHeads) + " KV heads";
}

std::string describeContextParallel(const KvCacheConfig& config)
{
    if (config.dcpSize == 1)
        return {};
    return "DCP " + std::to_string(config.dcpSize) + ": each group of " + std::to_string(config.dcpSize) +
           " ranks holding a head splits its positions, in runs of " + std::to_string(config.cpInterleave) +
           " (each head's first such group analysed, the others checked as replicas)";
}

std::string describeGroup(const KvCacheGroup& group)
{
    const std::string name = group.specName.empty() ? specTypeName(group.specType) : group.specName;
    const std::string layers = std::to_string(group.layerNames.size()) + (group.layerNames.size() == 1 ? " layer" : " layers");
    if (group.specType == SpecType::NotCompared)
        return name + ", " + layers + ", not compared (" + group.notComparedWhy + ")";
    std::string out = name;
    if (group.slidingWindow)
        out += " (sliding_window " + std::to_string(*group.slidingWindow) + ")";
    if (group.attentionChunkSize)
        out += " (attention_chunk_size " + std::to_string(*group.attentionChunkSize) + ")";
    // (vLLM's names for its 4-bit caches, which say more than their element types)
    const auto cacheName = [](DType d) {
        return d == DType::Float4E2M1 || d == DType::Int4TokenHead ? configDTypeName(d) : dtypeName(d);
    };
    std::string dtype = group.dsMla ? "fp8_ds_mla" : cacheName(group.dtype);
    if (group.vDtype)
        dtype = "K " + dtype + " / V " + cacheName(*group.vDtype);
    out += ", block_size " + std::to_string(group.blockSize) + ", " + dtype + ", " + layers + ", head_size " +
           std::to_string(group.headSize);
    if (group.specType == SpecType::Mla)
        out += " (kv_lora_rank " + std::to_string(group.kvLoraRank) + " + qk_rope_head_dim " +
               std::to_string(group.qkRopeHeadDim) + ")";
    return out;
}

int KvCacheGroup::partWidth(KvPart part) const
{
    if (specType != SpecType::Mla)
        return headSize;
    return part == KvPart::K ? kvLoraRank : qkRopeHeadDim;
}

DType KvCacheGroup::partDType(KvPart part) const
{
    if (part == KvPart::V && dsMla)
        return DType::BFloat16;
    return part == KvPart::V && vDtype ? *vDtype : dtype;
}

bool KvCacheGroup::quantised() const
{
    return isQuantised(partDType(KvPart::K)) || isQuantised(partDType(KvPart::V));
}

DType KvCacheGroup::layerDType() const
{
    return isQuantised(partDType(KvPart::K)) ? partDType(KvPart::K) : partDType(KvPart::V);
}

std::string configDTypeName(DType dtype)
{
    if (dtype == DType::Float4E2M1)
        return "nvfp4";
    if (dtype == DType::Int4TokenHead)
        return "int4_per_token_head";
    return "torch." + dtypeName(dtype);
}

const char* partWidthName(const KvCacheGroup& group, KvPart part)
{
    if (group.specType != SpecType::Mla)
        return "head_size";
    return part == KvPart::K ? "kv_lora_rank" : "qk_rope_head_dim";
}

const char* partLabel(const KvCacheGroup& group, KvPart part)
{
    if (group.specType == SpecType::Mla)
        return part == KvPart::K ? "c_kv" : "k_pe";
    return kvPartName(part);
}

std::vector<std::string> describeNotCompared(const std::vector<std::pair<std::string, std::string>>& layers)
{
    std::vector<std::string> kinds;
    for (const auto& [layer, why] : layers)
        if (std::find(kinds.begin(), kinds.end(), why) == kinds.end())
            kinds.push_back(why);
    std::vector<std::string> lines;
    for (const std::string& why : kinds) {
        std::vector<std::string> names;
        for (const auto& [layer, w] : layers)
            if (w == why)
                names.push_back(layer);
        std::string line = why + " (" + std::to_string(names.size()) + "):";
        for (std::size_t i = 0; i < names.size() && i < 6; ++i)
            line += (i ? ", " : " ") + names[i];
        lines.push_back(line + (names.size() > 6 ? ", ..." : ""));
    }
    return lines;
}

namespace {

// An MLA group's two widths, which must add up to its head_size.
void readMlaWidths(const Json& jg, KvCacheGroup& group, const Context& ctx, const std::string& where)
{
    group.kvLoraRank = requireInt(jg, "kv_lora_rank", 1, kMaxHeadSize, ctx, where);
    group.qkRopeHeadDim = requireInt(jg, "qk_rope_head_dim", 2, kMaxHeadSize, ctx, where);
    if (group.kvLoraRank + group.qkRopeHeadDim != group.headSize)
        ctx.fail(where + ".head_size", std::to_string(group.headSize) + " is not kv_lora_rank " +
                                           std::to_string(group.kvLoraRank) + " + qk_rope_head_dim " +
                                           std::to_string(group.qkRopeHeadDim));
    if (group.qkRopeHeadDim % 2 != 0)
        ctx.fail(where + ".qk_rope_head_dim", std::to_string(group.qkRopeHeadDim) + " is odd (rotary pairs)");
    if (group.dsMla && group.kvLoraRank % kDsMlaScaleGroup != 0)
        ctx.fail(where + ".kv_lora_rank", "fp8_ds_mla needs a multiple of " + std::to_string(kDsMlaScaleGroup) +
                                              ", got " + std::to_string(group.kvLoraRank));
}

// Groups whose layers hold no per-token KV to compare; anything else unknown is refused, so
// that a misspelt attention spec is not skipped quietly.
std::optional<std::string> notComparedKind(const std::string& spec)
{
    if (spec == "MambaSpec")
        return "state-space layers";
    if (spec == "CrossAttentionSpec" || spec == "EncoderOnlyAttentionSpec")
        return "encoder layers";
    return std::nullopt;
}

}  // namespace

namespace {

void readLayerNames(const Json& jg, KvCacheGroup& group, std::set<std::string>& seen, const Context& ctx,
                    const std::string& where)
{
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
}

// The group's spec type; false for a group that is only listed, not compared.
bool readSpecType(const Json& jg, KvCacheGroup& group, const Context& ctx, const std::string& where)
{
    if (!jg.contains("spec_type") || !jg["spec_type"].is_string())
        ctx.fail(where + ".spec_type", "missing or not a string");
    const std::string spec = jg["spec_type"].get<std::string>();
    group.specName = spec;
    if (jg.contains("not_compared")) {  // a group the capture side marks as holding no KV to compare
        if (!jg["not_compared"].is_string() || jg["not_compared"].get<std::string>().empty())
            ctx.fail(where + ".not_compared", "must say what the layers are, as a string");
        group.specType = SpecType::NotCompared;
        group.notComparedWhy = jg["not_compared"].get<std::string>();
        return false;
    }
    if (spec == "FullAttentionSpec")
        group.specType = SpecType::FullAttention;
    else if (spec == "SlidingWindowSpec")
        group.specType = SpecType::SlidingWindow;
    else if (spec == "ChunkedLocalAttentionSpec")
        group.specType = SpecType::ChunkedLocal;
    else if (spec == "MLAAttentionSpec")
        group.specType = SpecType::Mla;
    else if (const auto kind = notComparedKind(spec)) {
        group.specType = SpecType::NotCompared;
        group.notComparedWhy = *kind;
        return false;
    } else
        ctx.fail(where + ".spec_type", "'" + spec + "' is not supported (compared: FullAttentionSpec, "
                                       "SlidingWindowSpec, ChunkedLocalAttentionSpec, MLAAttentionSpec; listed, "
                                       "not compared: MambaSpec, CrossAttentionSpec, EncoderOnlyAttentionSpec)");
    return true;
}

// Block size, heads per rank, head size, and the window or chunk the spec type needs.
void readShape(const Json& jg, KvCacheGroup& group, const Context& ctx, const std::string& where)
{
    group.blockSize = requireInt(jg, "block_size", 1, kMaxBlockSize, ctx, where);
    group.numKvHeads = requireInt(jg, "num_kv_heads", 1, kMaxHeads, ctx, where);
    group.headSize = requireInt(jg, "head_size", 1, kMaxHeadSize, ctx, where);
    if (jg.contains("sliding_window") && !jg["sliding_window"].is_null())
        group.slidingWindow = requireInt(jg, "sliding_window", 1, 1 << 30, ctx, where);
    if (group.specType == SpecType::SlidingWindow && !group.slidingWindow)
        ctx.fail(where + ".sliding_window", "SlidingWindowSpec needs a sliding_window");
    const bool chunkGiven = jg.contains("attention_chunk_size") && !jg["attention_chunk_size"].is_null();
    if (group.specType == SpecType::ChunkedLocal && !chunkGiven)
        ctx.fail(where + ".attention_chunk_size", "missing (ChunkedLocalAttentionSpec needs one)");
    if (chunkGiven)
        group.attentionChunkSize = requireInt(jg, "attention_chunk_size", 1, 1 << 30, ctx, where);
}

// The format K and V are stored in (dtype, v_dtype), with what each format needs of the head
// size, and an MLA group's widths.
void readFormat(const Json& jg, KvCacheGroup& group, const Context& ctx, const std::string& where)
{
    if (!jg.contains("dtype") || !jg["dtype"].is_string())
        ctx.fail(where + ".dtype", "missing or not a string");
    const std::string dtypeText = jg["dtype"].get<std::string>();
    group.dsMla = group.specType == SpecType::Mla && dtypeText == "fp8_ds_mla";
    const auto dtype = group.dsMla ? std::optional(DType::Float8E4M3) : parseDType(dtypeText);
    const std::string supported = "bfloat16, float16, float32, float8_e4m3fn, float8_e5m2, int8, nvfp4, "
                                  "int4_per_token_head";
    if (!dtype)
        ctx.fail(where + ".dtype", "unsupported dtype '" + dtypeText + "' (supported: " + supported +
                                       (group.specType == SpecType::Mla ? ", fp8_ds_mla)" : ")"));
    group.dtype = *dtype;
    if (jg.contains("v_dtype") && !jg["v_dtype"].is_null()) {
        if (!jg["v_dtype"].is_string())
            ctx.fail(where + ".v_dtype", "must be a dtype name, got " + jsonText(jg["v_dtype"]));
        const std::string vText = jg["v_dtype"].get<std::string>();
        const auto vDtype = parseDType(vText);
        if (!vDtype)
            ctx.fail(where + ".v_dtype", "unsupported dtype '" + vText + "' (supported: " + supported + ")");
        if (group.specType == SpecType::Mla)
            ctx.fail(where + ".v_dtype", "an MLA latent has one dtype");
        if (*vDtype != group.dtype)
            group.vDtype = *vDtype;
    }
    if (group.specType == SpecType::Mla &&
        (group.dtype == DType::Float4E2M1 || group.dtype == DType::Int4TokenHead))
        ctx.fail(where + ".dtype", dtypeText + " is not read for MLA latents");
    for (KvPart part : {KvPart::K, KvPart::V}) {
        const DType d = group.partDType(part);
        const std::string field = where + (part == KvPart::V && group.vDtype ? ".v_dtype" : ".dtype");
        if (d == DType::Float4E2M1 && group.headSize % 16 != 0)
            ctx.fail(field, "nvfp4 needs head_size a multiple of 16 (a block scale per 16 values), got " +
                                std::to_string(group.headSize));
        if (d == DType::Int4TokenHead && (group.headSize & (group.headSize - 1)) != 0)
            ctx.fail(field, "int4_per_token_head needs head_size a power of two (its Hadamard rotation), got " +
                                std::to_string(group.headSize));
    }
    if (group.specType == SpecType::Mla)
        readMlaWidths(jg, group, ctx, where);
}

// The group's heads over all ranks (its own total_num_kv_heads, else the config's), against
// tp_size and decode context parallelism.
void readHeadsOverRanks(const Json& jg, KvCacheGroup& group, const KvCacheConfig& cfg, const Context& ctx,
                        const std::string& where)
{
    const bool ownTotal = jg.contains("total_num_kv_heads") && !jg["total_num_kv_heads"].is_null();
    const std::string totalField = ownTotal ? where + ".total_num_kv_heads" : std::string("total_num_kv_heads");
    group.totalKvHeads = group.specType == SpecType::Mla ? 1
                         : ownTotal ? requireInt(jg, "total_num_kv_heads", 1, kMaxHeads, ctx, where)
                                    : cfg.totalNumKvHeads;
    const int total = group.totalKvHeads;
    if (total >= cfg.tpSize && total % cfg.tpSize != 0)
        ctx.fail(totalField, std::to_string(total) + " heads cannot be partitioned over tp_size " + std::to_string(cfg.tpSize));
    if (total < cfg.tpSize && cfg.tpSize % total != 0)
        ctx.fail(totalField, std::to_string(total) + " heads cannot be replicated evenly over tp_size " +
                                 std::to_string(cfg.tpSize));
    const int perRank = cfg.layout(group).headsPerRank();
    if (group.numKvHeads != perRank)
        ctx.fail(where + ".num_kv_heads",
                 std::to_string(group.numKvHeads) + " per rank disagrees with total_num_kv_heads " +
                     std::to_string(total) + " over tp_size " + std::to_string(cfg.tpSize) + " (expected " +
                     std::to_string(perRank) + ")");
    if (cfg.dcpSize > 1) {
        // vLLM bounds dcp_size by tp_size / total_num_kv_heads: DCP splits the ranks that
        // would otherwise hold copies of one head.
        const int copies = total < cfg.tpSize ? cfg.tpSize / total : 1;
        if (copies % cfg.dcpSize != 0)
            ctx.fail("dcp_size", std::to_string(cfg.dcpSize) + " needs each KV head on a multiple of " +
                                     std::to_string(cfg.dcpSize) + " TP ranks; " +
                                     (group.specType == SpecType::Mla ? std::string("the latent")
                                                                      : "each of the " + std::to_string(total) + " heads") +
                                     (ownTotal ? " of " + where : std::string()) + " is on " + std::to_string(copies) +
                                     " of tp_size " + std::to_string(cfg.tpSize));
        if (group.blockSize % cfg.cpInterleave != 0)
            ctx.fail("cp_kv_cache_interleave_size", std::to_string(cfg.cpInterleave) + " does not divide " + where +
                                                        ".block_size " + std::to_string(group.blockSize));
    }
}

// MLA is not mixed with other attention.
void checkNotMixed(const KvCacheGroup& group, const std::vector<KvCacheGroup>& earlierGroups, const Context& ctx,
                   const std::string& where)
{
    for (const KvCacheGroup& earlier : earlierGroups)
        if (earlier.specType != SpecType::NotCompared &&
            (earlier.specType == SpecType::Mla) != (group.specType == SpecType::Mla))
            ctx.fail(where + ".spec_type", group.specName + " beside " + earlier.specName +
                                               ": a config mixing MLA and other attention is not supported");
}

// Attention groups may differ in head size (a layer's own widths go with it); MLA groups share
// one split of the latent.
void checkMlaSplit(const KvCacheGroup& group, const std::vector<KvCacheGroup>& earlierGroups, const Context& ctx,
                   const std::string& where)
{
    for (const KvCacheGroup& earlier : earlierGroups)
        if (earlier.specType == SpecType::Mla && group.specType == SpecType::Mla &&
            (group.kvLoraRank != earlier.kvLoraRank || group.qkRopeHeadDim != earlier.qkRopeHeadDim ||
             group.dsMla != earlier.dsMla))
            ctx.fail(where + ".kv_lora_rank", "this MLA group's split (kv_lora_rank " + std::to_string(group.kvLoraRank) +
                                                  (group.dsMla ? ", fp8_ds_mla" : "") +
                                                  ") differs from another MLA group's (kv_lora_rank " +
                                                  std::to_string(earlier.kvLoraRank) + (earlier.dsMla ? ", fp8_ds_mla" : "") + ")");
}

}  // namespace

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
    if (optionalInt(root, "pcp_size", 1, ctx) > 1)
        ctx.fail("pcp_size", "prefill context parallelism (> 1) is not supported");
    cfg.dcpSize = std::max(1, optionalInt(root, "dcp_size", 1, ctx));
    cfg.cpInterleave = std::max(1, optionalInt(root, "cp_kv_cache_interleave_size", 1, ctx));
    if (cfg.tpSize % cfg.dcpSize != 0)
        ctx.fail("dcp_size", std::to_string(cfg.dcpSize) + " does not divide tp_size " + std::to_string(cfg.tpSize) +
                                 " (DCP groups are made of TP ranks)");

    // An MLA config's total_num_kv_heads is the model's, which its latent ignores. (A group marked
    // not_compared is only listed: an MLA one, such as DeepSeek-V3.2's indexer keys, leaves the
    // heads of the groups that are read alone.)
    const Json listed = root.contains("groups") && root["groups"].is_array() ? root["groups"] : Json::array();
    const bool mlaConfig = std::any_of(listed.begin(), listed.end(), [](const Json& g) {
        return g.is_object() && g.contains("spec_type") && g["spec_type"] == "MLAAttentionSpec" &&
               !g.contains("not_compared");
    });
    if (mlaConfig)
        cfg.totalNumKvHeads = 1;  // the latent is one vector per token on every rank (TP replicates it)

    if (!root.contains("groups") || !root["groups"].is_array() || root["groups"].empty())
        ctx.fail("groups", "must be a non-empty list");
    std::set<std::string> seen;
    for (std::size_t g = 0; g < root["groups"].size(); ++g) {
        const std::string where = "groups[" + std::to_string(g) + "]";
        const Json& jg = root["groups"][g];
        if (!jg.is_object())
            ctx.fail(where, "must be an object");
        KvCacheGroup group;

        readLayerNames(jg, group, seen, ctx, where);
        if (!readSpecType(jg, group, ctx, where)) {
            cfg.groups.push_back(std::move(group));
            continue;
        }
        readShape(jg, group, ctx, where);
        readFormat(jg, group, ctx, where);
        checkNotMixed(group, cfg.groups, ctx, where);
        readHeadsOverRanks(jg, group, cfg, ctx, where);
        checkMlaSplit(group, cfg.groups, ctx, where);
        cfg.groups.push_back(std::move(group));
    }
    if (cfg.layerNames().empty()) {
        std::string specs;
        for (const KvCacheGroup& g : cfg.groups)
            if (specs.find(g.specName) == std::string::npos)
                specs += (specs.empty() ? "" : ", ") + g.specName;
        ctx.fail("groups", "no group kvscope compares (only " + specs + " layers)");
    }
    return cfg;
}

std::string KvCacheConfig::toJson() const
{
    Json root;
    root["num_blocks"] = numBlocks;
    root["tp_size"] = tpSize;
    root["total_num_kv_heads"] = totalNumKvHeads;
    root["dcp_size"] = dcpSize;
    if (dcpSize > 1)
        root["cp_kv_cache_interleave_size"] = cpInterleave;
    root["pcp_size"] = 1;
    root["groups"] = Json::array();
    for (const KvCacheGroup& g : groups) {
        Json jg;
        jg["layer_names"] = g.layerNames;
        jg["spec_type"] = g.specName.empty() ? specTypeName(g.specType) : g.specName;
        if (g.specType == SpecType::NotCompared) {
            if (!notComparedKind(jg["spec_type"].get<std::string>()))
                jg["not_compared"] = g.notComparedWhy;
            root["groups"].push_back(jg);
            continue;
        }
        if (g.attentionChunkSize)
            jg["attention_chunk_size"] = *g.attentionChunkSize;
        jg["block_size"] = g.blockSize;
        jg["sliding_window"] = g.slidingWindow ? Json(*g.slidingWindow) : Json(nullptr);
        jg["dtype"] = g.dsMla ? "fp8_ds_mla" : configDTypeName(g.dtype);
        if (g.vDtype)
            jg["v_dtype"] = configDTypeName(*g.vDtype);
        jg["num_kv_heads"] = g.numKvHeads;
        if (g.specType != SpecType::Mla && g.specType != SpecType::NotCompared && g.totalKvHeads > 0 &&
            g.totalKvHeads != totalNumKvHeads)
            jg["total_num_kv_heads"] = g.totalKvHeads;
        jg["head_size"] = g.headSize;
        if (g.specType == SpecType::Mla) {
            jg["kv_lora_rank"] = g.kvLoraRank;
            jg["qk_rope_head_dim"] = g.qkRopeHeadDim;
        }
        root["groups"].push_back(jg);
    }
    return jsonText(root);
}

int TpLayout::headsPerRank() const
{
    return std::max(1, totalHeads / tpSize);
}

std::vector<int> TpLayout::contributingRanks() const
{
    std::vector<int> ranks;
    const int stride = mode() == TpMode::Partitioned ? 1 : tpSize / totalHeads;
    for (int r = 0; r < tpSize; r += stride)
        ranks.push_back(r);
    return ranks;
}

std::vector<int> TpLayout::ranksRead() const
{
    std::vector<int> ranks;
    for (int leader : contributingRanks())
        for (int d = 0; d < dcpSize; ++d)
            ranks.push_back(leader + d);
    return ranks;
}

std::vector<int> TpLayout::ranksHolding(int head) const
{
    if (mode() == TpMode::Partitioned)
        return {head / headsPerRank()};
    const int stride = tpSize / totalHeads;
    std::vector<int> ranks;
    for (int r = head * stride; r < (head + 1) * stride; ++r)
        ranks.push_back(r);
    return ranks;
}

std::vector<int> TpLayout::ranksHolding(int head, int dcpRank) const
{
    std::vector<int> ranks;
    for (int r : ranksHolding(head))
        if (r % dcpSize == dcpRank)
            ranks.push_back(r);
    return ranks;
}

int TpLayout::headOnRank(int rank, int j) const
{
    return mode() == TpMode::Partitioned ? rank * headsPerRank() + j : rank / (tpSize / totalHeads);
}

TpLayout KvCacheConfig::layoutOf(const std::string& layer) const
{
    const int g = groupOf(layer);
    return layout(g >= 0 && groups[std::size_t(g)].specType != SpecType::NotCompared ? groups[std::size_t(g)] : firstCompared());
}

int KvCacheConfig::maxKvHeads() const
{
    int most = 1;
    for (const KvCacheGroup& g : groups)
        if (g.specType != SpecType::NotCompared)
            most = std::max(most, g.totalKvHeads);
    return most;
}

TokenSlot KvCacheConfig::slotOf(const KvCacheGroup& group, std::int64_t pos) const
{
    if (dcpSize == 1)
        return {pos / group.blockSize, int(pos % group.blockSize), 0};
    const std::int64_t span = positionsPerEntry(group);
    const std::int64_t within = pos % span;
    const std::int64_t run = within / cpInterleave;
    return {pos / span, int(within / (std::int64_t(dcpSize) * cpInterleave) * cpInterleave + within % cpInterleave),
            int(run % dcpSize)};
}

int KvCacheConfig::groupOf(const std::string& layer) const
{
    for (std::size_t g = 0; g < groups.size(); ++g)
        for (const std::string& name : groups[g].layerNames)
            if (name == layer)
                return int(g);
    return -1;
}

long long layerNumber(const std::string& s)
{
    const auto it = std::find_if(s.begin(), s.end(), [](unsigned char c) { return std::isdigit(c); });
    if (it == s.end())
        return -1;
    long long n = 0;
    for (auto p = it; p != s.end() && std::isdigit(static_cast<unsigned char>(*p)) && n < (1LL << 40); ++p)
        n = n * 10 + (*p - '0');
    return n;
}

static void sortByModelOrder(std::vector<std::string>& names)
{
    std::stable_sort(names.begin(), names.end(), [](const std::string& a, const std::string& b) {
        const long long na = layerNumber(a), nb = layerNumber(b);
        return na != nb ? na < nb : a < b;
    });
}

std::vector<std::string> KvCacheConfig::layerNames() const
{
    std::vector<std::string> names;
    for (const KvCacheGroup& g : groups)
        if (g.specType != SpecType::NotCompared)
            names.insert(names.end(), g.layerNames.begin(), g.layerNames.end());
    sortByModelOrder(names);
    return names;
}

std::vector<std::string> KvCacheConfig::allLayerNames() const
{
    std::vector<std::string> names;
    for (const KvCacheGroup& g : groups)
        names.insert(names.end(), g.layerNames.begin(), g.layerNames.end());
    sortByModelOrder(names);
    return names;
}

bool KvCacheConfig::isCompared(const std::string& layer) const
{
    const int g = groupOf(layer);
    return g >= 0 && groups[std::size_t(g)].specType != SpecType::NotCompared;
}

std::vector<std::pair<std::string, std::string>> KvCacheConfig::notComparedLayers() const
{
    std::vector<std::string> names;
    for (const KvCacheGroup& g : groups)
        if (g.specType == SpecType::NotCompared)
            names.insert(names.end(), g.layerNames.begin(), g.layerNames.end());
    sortByModelOrder(names);
    std::vector<std::pair<std::string, std::string>> out;
    for (const std::string& name : names)
        out.emplace_back(name, groups[std::size_t(groupOf(name))].notComparedWhy);
    return out;
}

const KvCacheGroup& KvCacheConfig::firstCompared() const
{
    for (const KvCacheGroup& g : groups)
        if (g.specType != SpecType::NotCompared)
            return g;
    return groups.front();  // fromJson refuses a config without one
}

}  // namespace kvscope
