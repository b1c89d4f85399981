#include "dumps/dump_import.h"

#include "format/bundle_error.h"
#include "format/bundle_writer.h"
#include "dumps/pt_value.h"
#include "format/safetensors_reader.h"

#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <sstream>

namespace kvscope {

namespace fs = std::filesystem;
using Json = nlohmann::json;

namespace {

std::string readText(const fs::path& file)
{
    std::ifstream in(file);
    if (!in)
        throw BundleError(file.string(), {}, "missing (see docs/import.md for the expected files)");
    std::stringstream s;
    s << in.rdbuf();
    return s.str();
}

Json readJson(const fs::path& file)
{
    try {
        return Json::parse(readText(file));
    } catch (const Json::exception& e) {  // parse errors, and numbers out of range (1e999)
        throw BundleError(file.string(), {}, std::string("not valid JSON: ") + e.what());
    }
}

const PtValue& member(const PtValue& dict, const std::string& key, const std::string& file, const std::string& where)
{
    const PtValue* v = dict.find(key);
    if (!v)
        throw BundleError(file, where, "has no '" + key + "'");
    return *v;
}

const RawTensor& floatTensor(const PtValue& v, const std::string& file, const std::string& where)
{
    if (v.kind != PtValue::Kind::FloatTensor)
        throw BundleError(file, where, "must be a bfloat16/float16/float32 tensor, is a " + v.kindName());
    return v.tensor;
}

// (k, v) of one layer: {'k': k, 'v': v} or [k, v] / (k, v).
std::pair<RawTensor, RawTensor> kvPair(const PtValue& v, const std::string& file, const std::string& where)
{
    if (v.kind == PtValue::Kind::Dict)
        return {floatTensor(member(v, "k", file, where), file, where + "['k']"),
                floatTensor(member(v, "v", file, where), file, where + "['v']")};
    if (v.kind == PtValue::Kind::List && v.items.size() >= 2)
        return {floatTensor(v.items[0], file, where + "[0]"), floatTensor(v.items[1], file, where + "[1]")};
    throw BundleError(file, where, "must be {'k': k, 'v': v} or (k, v), is a " + v.kindName());
}

BlockTable tableOf(const PtValue& v, const std::string& file, const std::string& where)
{
    if (v.kind != PtValue::Kind::IntTensor)
        throw BundleError(file, where, "must be an integer tensor [batch, max_blocks], is a " + v.kindName());
    BlockTable t;
    if (v.shape.size() == 1)
        t.rows = 1, t.cols = v.shape[0];
    else if (v.shape.size() == 2)
        t.rows = v.shape[0], t.cols = v.shape[1];
    else
        throw BundleError(file, where, "must be [batch, max_blocks], has shape " + shapeToString(v.shape));
    for (std::int64_t id : v.intValues) {
        if (id < -1 || id > INT32_MAX)
            throw BundleError(file, where, "entry " + std::to_string(id) + " is neither a block id nor -1");
        t.entries.push_back(std::int32_t(id));
    }
    return t;
}

std::vector<BlockTable> blockTables(const fs::path& dir, std::size_t groups)
{
    std::vector<BlockTable> tables;
    const fs::path combined = dir / "block_tables.pt";
    if (fs::exists(combined)) {
        const PtValue v = loadPtFile(combined.string());
        if (v.kind == PtValue::Kind::IntTensor && groups == 1)
            tables.push_back(tableOf(v, combined.string(), "root"));
        else if (v.kind == PtValue::Kind::List)
            for (std::size_t g = 0; g < v.items.size(); ++g)
                tables.push_back(tableOf(v.items[g], combined.string(), "root[" + std::to_string(g) + "]"));
        else
            throw BundleError(combined.string(), "root", "must be a list of per-group tables (or one tensor for one group)");
    } else {
        for (std::size_t g = 0; g < groups; ++g) {
            const fs::path file = dir / ("block_table_group" + std::to_string(g) + ".pt");
            if (!fs::exists(file))
                throw BundleError(file.string(), {}, "missing: block tables come as block_tables.pt or block_table_group<G>.pt");
            tables.push_back(tableOf(loadPtFile(file.string()), file.string(), "root"));
        }
    }
    if (tables.size() != groups)
        throw BundleError(combined.string(), {}, std::to_string(tables.size()) + " block tables for " +
                                                     std::to_string(groups) + " KV cache groups");
    return tables;
}

EngineSnapshot readSnapshot(const fs::path& dir, const KvCacheConfig& config, const Json& info, const fs::path& infoFile)
{
    EngineSnapshot snap;
    for (const char* key : {"seq_len", "batch_row", "validated_until"})
        if (info.contains(key) && !info[key].is_number_integer())
            throw BundleError(infoFile.string(), key, "must be an integer");
    if (!info.contains("seq_len"))
        throw BundleError(infoFile.string(), "seq_len", "missing");
    snap.batchRow = info.value("batch_row", std::int64_t(0));
    snap.blockTables = blockTables(dir, config.groups.size());
    snap.seqLens.assign(std::size_t(snap.blockTables.front().rows), -1);
    if (snap.batchRow < 0 || snap.batchRow >= std::int64_t(snap.seqLens.size()))
        throw BundleError(infoFile.string(), "batch_row", "outside the block tables' batch");
    snap.seqLens[std::size_t(snap.batchRow)] = info["seq_len"].get<std::int64_t>();
    if (info.contains("validated_until"))
        snap.validatedUntil = info["validated_until"].get<std::int64_t>();
    snap.keepOnlyReferencedBlocks = true;
    for (int r = 0; r < config.tpSize; ++r) {
        const fs::path file = dir / ("kv_caches_rank" + std::to_string(r) + ".pt");
        if (!fs::exists(file))
            throw BundleError(file.string(), {}, "missing: one get_kv_caches dump per TP rank (tp_size " +
                                                     std::to_string(config.tpSize) + ")");
        const PtValue caches = loadPtFile(file.string());
        if (caches.kind != PtValue::Kind::Dict)
            throw BundleError(file.string(), "root", "must be a dict {layer_name: {'k': k, 'v': v}}, is a " + caches.kindName());
        std::map<std::string, std::pair<RawTensor, RawTensor>> layers;
        for (const auto& [layer, kv] : caches.entries)
            if (config.groupOf(layer) < 0 || config.isCompared(layer))  // a state-space layer's state: skipped
                layers[layer] = kvPair(kv, file.string(), "layer '" + layer + "'");
        snap.ranks.push_back(std::move(layers));
    }
    return snap;
}

// HF past_key_values from name.pt or name.safetensors, per layer in model order.
std::map<std::string, std::pair<RawTensor, RawTensor>> readReference(const fs::path& dir, const std::string& name,
                                                                     const KvCacheConfig& config, bool& found)
{
    std::map<std::string, std::pair<RawTensor, RawTensor>> out;
    // HF's cache holds an entry for every layer of the model, a hybrid model's state-space layers
    // too: index by model position, keep the compared layers.
    const std::vector<std::string> layers = config.allLayerNames();
    const fs::path pt = dir / (name + ".pt"), st = dir / (name + ".safetensors");
    found = fs::exists(pt) || fs::exists(st);
    if (fs::exists(pt)) {
        const PtValue v = loadPtFile(pt.string());
        if (v.kind == PtValue::Kind::List) {
            if (v.items.size() != layers.size())
                throw BundleError(pt.string(), "root", std::to_string(v.items.size()) + " layers of past_key_values, the config has " +
                                                           std::to_string(layers.size()));
            for (std::size_t i = 0; i < layers.size(); ++i)
                if (config.isCompared(layers[i]))
                    out[layers[i]] = kvPair(v.items[i], pt.string(), "root[" + std::to_string(i) + "]");
        } else if (v.kind == PtValue::Kind::Dict) {
            for (const std::string& layer : config.layerNames())
                out[layer] = kvPair(member(v, layer, pt.string(), "root"), pt.string(), "layer '" + layer + "'");
        } else {
            throw BundleError(pt.string(), "root", "must be past_key_values (a tuple of (k, v) per layer) or "
                                                   "{layer_name: (k, v)}, is a " + v.kindName());
        }
    } else if (fs::exists(st)) {
        const SafetensorsFile file(st.string());
        for (std::size_t i = 0; i < layers.size(); ++i) {
            if (!config.isCompared(layers[i]))
                continue;
            // "<layer>.k" / "<layer>.v", or "past_key_values.<i>.key" / ".value".
            const std::string byName = layers[i], byIndex = "past_key_values." + std::to_string(i);
            if (file.contains(byName + ".k"))
                out[layers[i]] = {file.tensor(byName + ".k"), file.tensor(byName + ".v")};
            else if (file.contains(byIndex + ".key"))
                out[layers[i]] = {file.tensor(byIndex + ".key"), file.tensor(byIndex + ".value")};
            else
                throw BundleError(st.string(), "tensor '" + byName + ".k'",
                                  "missing (nor '" + byIndex + ".key'): see docs/import.md");
        }
    }
    return out;
}

}  // namespace

void importDumpDirectory(const std::string& directory, const std::string& bundlePath)
{
    const fs::path dir(directory);
    if (!fs::is_directory(dir))
        throw BundleError(directory, {}, "is not a directory");
    const fs::path configFile = dir / "kv_cache_config.json";
    const KvCacheConfig config = KvCacheConfig::fromJson(readText(configFile), configFile.string(), "kv_cache_config");
    if (config.isMla())  // its dumps hold the latent, not {'k', 'v'}
        throw BundleError(configFile.string(), "kv_cache_config",
                          "an MLA config: kvscope import reads {'k': k, 'v': v} dumps; write MLA captures with "
                          "kvscope_capture's BundleWriter, which splits the latent into c_kv and k_pe (capture/README.md)");
    const fs::path promptFile = dir / "prompt.json";
    const Json prompt = readJson(promptFile);

    PromptRecord record;
    record.id = prompt.value("prompt_id", std::string("prompt_0"));
    try {
        record.inputIds = prompt.at("input_ids").get<std::vector<std::int64_t>>();
        const std::size_t promptLen = prompt.value("prompt_len", record.inputIds.size());
        if (promptLen < 1 || promptLen > record.inputIds.size())
            throw BundleError(promptFile.string(), "prompt_len", "outside 1..len(input_ids)");
        record.teacherTokens.assign(record.inputIds.begin() + std::ptrdiff_t(promptLen), record.inputIds.end());
        record.inputIds.resize(promptLen);
        if (prompt.contains("teacher_tokens"))
            record.teacherTokens = prompt["teacher_tokens"].get<std::vector<std::int64_t>>();
        if (prompt.contains("divergence_positions"))
            record.divergencePositions = prompt["divergence_positions"].get<std::vector<std::int64_t>>();
        if (prompt.contains("token_strings"))
            record.tokenStrings = prompt["token_strings"].get<std::vector<std::string>>();
    } catch (const Json::exception& e) {
        throw BundleError(promptFile.string(), {}, std::string("malformed: ") + e.what());
    }

    BundleMetadata meta;
    meta.model = prompt.value("model", std::string());
    meta.engine = prompt.value("engine", std::string());
    meta.notes = "imported by kvscope import from " + fs::absolute(dir).string();
    BundleWriter writer(bundlePath, meta, config);
    writer.addPrompt(record);

    // Snapshots: snapshot_<i>/ folders (each with a snapshot.json), or the folder itself.
    if (fs::is_directory(dir / "snapshot_0")) {
        for (int i = 0; fs::is_directory(dir / ("snapshot_" + std::to_string(i))); ++i) {
            const fs::path sub = dir / ("snapshot_" + std::to_string(i));
            writer.addSnapshot(record.id, readSnapshot(sub, config, readJson(sub / "snapshot.json"), sub / "snapshot.json"));
        }
    } else {
        writer.addSnapshot(record.id, readSnapshot(dir, config, prompt, promptFile));
    }

    for (ReferenceRole role : {ReferenceRole::Expected, ReferenceRole::Baseline}) {
        bool found = false;
        const std::string name = referenceRoleName(role);
        const auto layers = readReference(dir, name, config, found);
        if (!found) {
            if (role == ReferenceRole::Expected)
                throw BundleError((dir / "expected.pt").string(), {}, "missing (or expected.safetensors): the "
                                                                      "expected reference KV is required");
            continue;
        }
        for (const auto& [layer, kv] : layers)
            writer.addReference(record.id, role, layer, kv.first, kv.second);
    }
    for (LogitsRole role : {LogitsRole::Expected, LogitsRole::Actual, LogitsRole::Baseline}) {
        const fs::path file = dir / ("logits_" + logitsRoleName(role) + ".pt");
        if (!fs::exists(file))
            continue;
        const PtValue value = loadPtFile(file.string());
        const RawTensor& t = floatTensor(value, file.string(), "root");
        Logits logits;
        const auto& s = t.shape;
        if (s.size() == 2 || (s.size() == 3 && s[0] == 1)) {
            logits.steps = s[s.size() - 2];
            logits.vocab = s.back();
        } else {
            throw BundleError(file.string(), "root", "logits must be [steps, vocab], have shape " + shapeToString(s));
        }
        logits.values = t.toFloat();
        writer.addLogits(record.id, role, logits);
    }
    writer.finish();
}

}  // namespace kvscope
