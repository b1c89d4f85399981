#include "format/bundle_writer.h"

#include "format/provenance.h"

#include "format/bundle_error.h"
#include "format/recurrent_state.h"
#include "util/version.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <ctime>

namespace kvscope {

namespace {

std::string utcNow()
{
    const std::time_t now = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
    std::tm tm{};
    gmtime_r(&now, &tm);
    char text[32];
    std::strftime(text, sizeof text, "%Y-%m-%dT%H:%M:%SZ", &tm);
    return text;
}

// Keeps rows `ids` (physical block ids = row indices) of a [num_blocks, ...] tensor.
RawTensor selectBlocks(const RawTensor& all, const std::vector<std::int64_t>& ids)
{
    RawTensor out = all;
    out.shape[0] = std::int64_t(ids.size());
    const std::size_t rowBytes = std::size_t(all.stride(0)) * dtypeSize(all.dtype);
    out.bytes.resize(ids.size() * rowBytes);
    for (std::size_t i = 0; i < ids.size(); ++i)
        std::memcpy(out.bytes.data() + i * rowBytes, all.bytes.data() + std::size_t(ids[i]) * rowBytes, rowBytes);
    if (all.granularity() == ScaleGranularity::TokenHead || all.granularity() == ScaleGranularity::TokenGroup) {
        // per-token scales follow their blocks
        const std::size_t rowScales = all.scales.size() / std::size_t(all.shape[0]);
        out.scales.resize(ids.size() * rowScales);
        for (std::size_t i = 0; i < ids.size(); ++i)
            std::copy_n(all.scales.begin() + std::ptrdiff_t(std::size_t(ids[i]) * rowScales), rowScales,
                        out.scales.begin() + std::ptrdiff_t(i * rowScales));
    }
    if (!all.zeroPoints.empty()) {  // int4: one per token and head, like its scales
        const std::size_t rowPoints = all.zeroPoints.size() / std::size_t(all.shape[0]);
        out.zeroPoints.resize(ids.size() * rowPoints);
        for (std::size_t i = 0; i < ids.size(); ++i)
            std::copy_n(all.zeroPoints.begin() + std::ptrdiff_t(std::size_t(ids[i]) * rowPoints), rowPoints,
                        out.zeroPoints.begin() + std::ptrdiff_t(i * rowPoints));
    }
    return out;
}

bool validName(const std::string& name)
{
    return !name.empty() && name != "." && name != ".." && name.find('/') == std::string::npos;
}

}  // namespace

BundleWriter::BundleWriter(std::string path, const BundleMetadata& metadata, const KvCacheConfig& config)
    : m_path(std::move(path))
    , m_partialPath(m_path + ".partial")
    , m_config(config)
{
    m_file = std::make_unique<Hdf5File>(Hdf5File::create(m_partialPath));
    m_file->writeStringAttribute("/", "format", kBundleFormatName);
    m_file->writeIntAttribute("/", "format_version", kBundleFormatVersion);
    m_file->writeStringAttribute("/", "model", metadata.model);
    m_file->writeStringAttribute("/", "engine", metadata.engine);
    m_file->writeStringAttribute("/", "created", metadata.created.empty() ? utcNow() : metadata.created);
    m_file->writeStringAttribute("/", "notes", metadata.notes);
    m_file->writeStringAttribute("/", "writer", std::string("kvscope ") + kVersion);
    if ((m_engineOnly = metadata.engineOnly))
        m_file->writeIntAttribute("/", "engine_only", 1);
    for (const auto& [key, value] : metadata.extra)
        setMetadata(key, value);
    m_file->writeString(bundle_path::kConfig, config.json.empty() ? config.toJson() : config.json);
    m_file->createGroup(bundle_path::kPrompts);
}

BundleWriter::~BundleWriter()
{
    if (!m_finished) {
        m_file.reset();
        std::remove(m_partialPath.c_str());
    }
}

void BundleWriter::setMetadata(const std::string& key, const std::string& value)
{
    if (key == "format" || key == "format_version" || key == "writer" || key == "engine_only")
        fail("/", "metadata key '" + key + "' is reserved");
    m_file->writeStringAttribute("/", key, value);
}

void BundleWriter::fail(const std::string& object, const std::string& problem) const
{
    throw BundleError(m_path, object, problem);
}

const PromptRecord& BundleWriter::prompt(const std::string& id) const
{
    const auto it = m_prompts.find(id);
    if (it == m_prompts.end())
        fail(bundle_path::prompt(id), "prompt was not added");
    return it->second;
}

void BundleWriter::addPrompt(const PromptRecord& prompt)
{
    const std::string path = bundle_path::prompt(prompt.id);
    if (!validName(prompt.id))
        fail(path, "prompt id '" + prompt.id + "' cannot be an HDF5 name");
    if (m_prompts.count(prompt.id))
        fail(path, "prompt added twice");
    if (prompt.inputIds.empty())
        fail(path + "/input_ids", "empty prompt");
    const std::size_t total = prompt.inputIds.size() + prompt.teacherTokens.size();
    if (!prompt.tokenStrings.empty() && prompt.tokenStrings.size() != total)
        fail(path + "/token_strings", std::to_string(prompt.tokenStrings.size()) + " strings for " +
                                          std::to_string(total) + " positions");
    if (!prompt.provenance.empty()) {
        try {
            parseProvenance(prompt.provenance, std::int64_t(total));
        } catch (const std::invalid_argument& e) {
            fail(path, std::string("attribute 'provenance': ") + e.what());
        }
    }
    m_file->createGroup(path);
    m_file->writeIntAttribute(path, "prompt_len", std::int64_t(prompt.inputIds.size()));
    if (!prompt.provenance.empty())
        m_file->writeStringAttribute(path, "provenance", prompt.provenance);
    m_file->writeRaw(path + "/input_ids", H5T_STD_I64LE, {std::int64_t(prompt.inputIds.size())},
                     prompt.inputIds.data());
    if (!prompt.teacherTokens.empty())
        m_file->writeRaw(path + "/teacher_tokens", H5T_STD_I64LE, {std::int64_t(prompt.teacherTokens.size())},
                         prompt.teacherTokens.data());
    if (prompt.divergencePositions)
        m_file->writeRaw(path + "/divergence_positions", H5T_STD_I64LE,
                         {std::int64_t(prompt.divergencePositions->size())}, prompt.divergencePositions->data());
    if (!prompt.tokenStrings.empty())
        m_file->writeStrings(path + "/token_strings", prompt.tokenStrings);
    m_prompts.emplace(prompt.id, prompt);
}

void BundleWriter::writeKv(const std::string& dataset, const RawTensor& tensor, const std::vector<std::int64_t>& chunk)
{
    if (tensor.bytes.size() != std::size_t(tensor.numel()) * dtypeSize(tensor.dtype))
        fail(dataset, "tensor holds " + std::to_string(tensor.bytes.size()) + " bytes for shape " +
                          shapeToString(tensor.shape));
    if (!(tensor.scale > 0.0f) || !std::isfinite(tensor.scale))
        fail(dataset, "scale must be finite and positive");
    m_file->writeRawChunked(dataset, storageType(tensor.dtype), tensor.shape, tensor.bytes.data(), chunk);
    m_file->writeStringAttribute(dataset, "dtype", dtypeName(tensor.dtype));
    m_file->writeDoubleAttribute(dataset, "scale", tensor.scale);
    if (tensor.scales.empty() && (tensor.dtype == DType::Float4E2M1 || tensor.dtype == DType::Int4TokenHead))
        fail(dataset, "a " + dtypeName(tensor.dtype) + " cache needs its scales");
    if (tensor.scales.empty())
        return;
    // Finer scales: a float32 dataset beside the cache, chunked as it is.
    if (!isQuantised(tensor.dtype))
        fail(dataset, "scales for a " + dtypeName(tensor.dtype) + " tensor, which is not quantised");
    const std::vector<std::int64_t> shape = tensor.scalesShape();
    if (shape.empty() || std::int64_t(tensor.scales.size()) != Hdf5File::elementCount(shape))
        fail(dataset, std::to_string(tensor.scales.size()) + " scales do not fit " + shapeToString(tensor.shape));
    for (float v : tensor.scales)
        if (!(v >= 0.0f) || !std::isfinite(v))
            fail(dataset, "scales must be finite and not negative");
    const std::string path = dataset + "_scale";
    const std::int64_t chunkRows = shape.size() == 1 ? shape[0] : chunk.at(0);
    if (tensor.dtype == DType::Float4E2M1) {  // NVFP4: the block scales' e4m3 bits (decoded values re-encode exactly)
        std::vector<std::uint8_t> bits(tensor.scales.size());
        for (std::size_t i = 0; i < bits.size(); ++i)
            bits[i] = floatToFp8e4m3(tensor.scales[i]);
        m_file->writeRaw(path, H5T_STD_U8LE, shape, bits.data(), chunkRows);
        m_file->writeStringAttribute(path, "dtype", dtypeName(DType::Float8E4M3));
        return;
    }
    m_file->writeRaw(path, H5T_IEEE_F32LE, shape, tensor.scales.data(), chunkRows);
    m_file->writeStringAttribute(path, "dtype", dtypeName(DType::Float32));
    if (tensor.dtype != DType::Int4TokenHead)
        return;
    // int4 per token and head: zero points beside the scales, the rotation's signs once per layer.
    if (tensor.zeroPoints.size() != tensor.scales.size() || std::int64_t(tensor.rhtSigns.size()) != tensor.shape[3])
        fail(dataset, std::to_string(tensor.zeroPoints.size()) + " zero points and " + std::to_string(tensor.rhtSigns.size()) +
                          " signs for " + std::to_string(tensor.scales.size()) + " rows of " + std::to_string(tensor.shape[3]));
    m_file->writeRaw(dataset + "_zero_point", H5T_STD_U8LE, shape, tensor.zeroPoints.data(), chunkRows);
    const std::string signs = dataset.substr(0, dataset.rfind('/')) + "/rht_signs";
    if (!m_file->exists(signs))
        m_file->writeRaw(signs, H5T_STD_I8LE, {std::int64_t(tensor.rhtSigns.size())}, tensor.rhtSigns.data(),
                         std::int64_t(tensor.rhtSigns.size()));
}

void BundleWriter::addSnapshot(const std::string& promptId, const EngineSnapshot& snap)
{
    prompt(promptId);
    const std::size_t index = m_snapshotCounts[promptId];
    const std::string path = bundle_path::snapshot(promptId, index);

    // Check everything before writing anything.
    if (snap.blockTables.size() != m_config.groups.size())
        fail(path, std::to_string(snap.blockTables.size()) + " block tables for " +
                       std::to_string(m_config.groups.size()) + " groups");
    const std::int64_t rows = std::int64_t(snap.seqLens.size());
    if (snap.batchRow < 0 || snap.batchRow >= rows)
        fail(path, "batch_row " + std::to_string(snap.batchRow) + " outside " + std::to_string(rows) + " seq_lens");
    const std::int64_t seqLen = snap.seqLens[std::size_t(snap.batchRow)];
    if (seqLen < 1)
        fail(path, "the prompt's sequence length must be known and positive");
    const std::int64_t validatedUntil = snap.validatedUntil.value_or(seqLen - 1);
    if (validatedUntil < 0 || validatedUntil > seqLen)
        fail(path, "validated_until " + std::to_string(validatedUntil) + " outside [0, seq_len]");
    for (std::size_t g = 0; g < snap.blockTables.size(); ++g) {
        const BlockTable& t = snap.blockTables[g];
        if (t.rows != rows || std::int64_t(t.entries.size()) != t.rows * t.cols)
            fail(bundle_path::blockTable(promptId, index, g),
                 "block table [" + std::to_string(t.rows) + ", " + std::to_string(t.cols) + "] does not match " +
                     std::to_string(rows) + " seq_lens");
    }
    if (snap.ranks.size() != std::size_t(m_config.tpSize))
        fail(path, std::to_string(snap.ranks.size()) + " TP ranks, the config has tp_size " +
                       std::to_string(m_config.tpSize));

    std::vector<std::int64_t> stored = snap.storedBlockIds;
    if (snap.keepOnlyReferencedBlocks) {
        if (!stored.empty())
            fail(path, "keepOnlyReferencedBlocks needs tensors holding every block");
        std::set<std::int64_t> ids;
        for (std::size_t g = 0; g < snap.blockTables.size() && g < m_config.groups.size(); ++g)
            if (m_config.groups[g].specType != SpecType::NotCompared)  // their state is not stored
                for (std::int32_t id : snap.blockTables[g].entries)
                    if (id >= 0 && id < m_config.numBlocks)
                        ids.insert(id);
        stored.assign(ids.begin(), ids.end());
    }
    for (std::int64_t id : stored)
        if (id < 0 || id >= m_config.numBlocks)
            fail(path, "stored block id " + std::to_string(id) + " outside [0, num_blocks)");
    const std::int64_t inputRows = snap.storedBlockIds.empty() ? m_config.numBlocks : std::int64_t(stored.size());

    for (int r = 0; r < m_config.tpSize; ++r) {
        for (std::size_t g = 0; g < m_config.groups.size(); ++g) {
            const KvCacheGroup& group = m_config.groups[g];
            if (group.specType == SpecType::NotCompared)
                continue;
            for (const std::string& layer : group.layerNames) {
                const auto it = snap.ranks[std::size_t(r)].find(layer);
                if (it == snap.ranks[std::size_t(r)].end())
                    fail(bundle_path::engineKv(promptId, index, r, layer, "k"), "layer missing from rank " +
                                                                                  std::to_string(r));
                for (KvPart part : {KvPart::K, KvPart::V}) {
                    const RawTensor& t = part == KvPart::K ? it->second.first : it->second.second;
                    const std::string dataset = bundle_path::engineKv(promptId, index, r, layer, kvPartName(part));
                    const std::vector<std::int64_t> expected{inputRows, group.numKvHeads, group.blockSize,
                                                             group.partWidth(part)};
                    if (t.shape != expected)
                        fail(dataset, std::string(partLabel(group, part)) + " shape " + shapeToString(t.shape) +
                                          ", the config implies " + shapeToString(expected));
                    if (t.dtype != group.partDType(part))
                        fail(dataset, std::string(partLabel(group, part)) + " is " + dtypeName(t.dtype) +
                                          " but the config says " + dtypeName(group.partDType(part)));
                }
            }
        }
        for (const auto& [layer, kv] : snap.ranks[std::size_t(r)]) {
            if (m_config.groupOf(layer) < 0)
                fail(bundle_path::engineKv(promptId, index, r, layer, "k"), "layer belongs to no group of the config");
            if (!m_config.isCompared(layer))
                fail(bundle_path::engineKv(promptId, index, r, layer, "k"),
                     "a layer of a group kvscope does not compare (" +
                         m_config.groups[std::size_t(m_config.groupOf(layer))].notComparedWhy + "): leave it out");
        }
    }

    m_file->createGroup(path);
    m_file->writeIntAttribute(path, "batch_row", snap.batchRow);
    m_file->writeIntAttribute(path, "validated_until", validatedUntil);
    m_file->writeRaw(path + "/seq_lens", H5T_STD_I64LE, {rows}, snap.seqLens.data());
    // A subset of blocks, even an empty one (every table entry -1), is recorded as such.
    if (snap.keepOnlyReferencedBlocks || !snap.storedBlockIds.empty())
        m_file->writeRaw(path + "/physical_block_ids", H5T_STD_I64LE, {std::int64_t(stored.size())}, stored.data());
    for (std::size_t g = 0; g < snap.blockTables.size(); ++g) {
        const BlockTable& t = snap.blockTables[g];
        m_file->writeRaw(bundle_path::blockTable(promptId, index, g), H5T_STD_I32LE, {t.rows, t.cols},
                         t.entries.data());
    }
    for (int r = 0; r < m_config.tpSize; ++r) {
        for (const auto& [layer, kv] : snap.ranks[std::size_t(r)]) {
            const KvCacheGroup& group = m_config.groups[std::size_t(m_config.groupOf(layer))];
            // One block per chunk (several only when blocks are under 4 KiB): a checksum covers a
            // whole chunk, so one block can be read and verified alone.
            const std::int64_t blockBytes = std::int64_t(group.numKvHeads) * group.blockSize *
                                            group.partWidth(KvPart::K) * std::int64_t(dtypeSize(group.dtype));
            const std::int64_t chunkRows = std::max<std::int64_t>(1, 4096 / blockBytes);
            const bool select = snap.keepOnlyReferencedBlocks;
            for (const auto& [part, tensor] : {std::pair{"k", &kv.first}, std::pair{"v", &kv.second}}) {
                std::vector<std::int64_t> chunk = tensor->shape;
                chunk.at(0) = chunkRows;
                writeKv(bundle_path::engineKv(promptId, index, r, layer, part), select ? selectBlocks(*tensor, stored) : *tensor,
                        chunk);
            }
        }
    }
    ++m_snapshotCounts[promptId];
}

std::vector<std::int64_t> referenceChunk(const RawTensor& tensor)
{
    const std::int64_t heads = tensor.shape[1], positions = tensor.shape[2], width = tensor.shape[3];
    if (positions <= kWholeReferenceChunk)
        return {1, heads, positions, width};
    const std::int64_t positionBytes = std::max<std::int64_t>(1, heads * width * std::int64_t(dtypeSize(tensor.dtype)));
    return {1, heads, std::max<std::int64_t>(1, (std::int64_t(1) << 20) / positionBytes), width};
}

void BundleWriter::addReference(const std::string& promptId, ReferenceRole role, const std::string& layer,
                                const RawTensor& k, const RawTensor& v, std::int64_t batchRow)
{
    prompt(promptId);
    const std::string kPath = bundle_path::referenceKv(promptId, role, layer, "k");
    if (m_engineOnly)
        fail(kPath, "an engine-only bundle holds no reference KV");
    const int g = m_config.groupOf(layer);
    if (g < 0)
        fail(kPath, "layer belongs to no group of the config");
    if (!m_config.isCompared(layer))
        fail(kPath, "a layer of a group kvscope does not compare (" + m_config.groups[std::size_t(g)].notComparedWhy +
                        "): leave it out");
    const KvCacheGroup& group = m_config.groups[std::size_t(g)];
    const std::string kName = partLabel(group, KvPart::K), vName = partLabel(group, KvPart::V);
    if (k.shape.size() != 4 || v.shape.size() != 4 || !std::equal(k.shape.begin(), k.shape.end() - 1, v.shape.begin()))
        fail(kPath, kName + " " + shapeToString(k.shape) + " and " + vName + " " + shapeToString(v.shape) +
                        " must each be [batch, heads, seq, width] and share batch, heads and seq");
    if (k.shape[1] != group.totalKvHeads || k.shape[3] != group.partWidth(KvPart::K) ||
        v.shape[3] != group.partWidth(KvPart::V))
        fail(kPath, kName + " " + shapeToString(k.shape) + " and " + vName + " " + shapeToString(v.shape) +
                        " disagree with total_num_kv_heads " + std::to_string(group.totalKvHeads) + " / widths " +
                        std::to_string(group.partWidth(KvPart::K)) + ", " + std::to_string(group.partWidth(KvPart::V)));
    if (batchRow < 0 || batchRow >= k.shape[0])
        fail(kPath, "batch row " + std::to_string(batchRow) + " outside the batch");
    const std::string rolePath = bundle_path::referenceRole(promptId, role);
    m_file->createGroup(rolePath);
    m_file->writeIntAttribute(rolePath, "batch_row", batchRow);
    for (const auto& [path, tensor] : {std::pair{kPath, &k}, std::pair{bundle_path::referenceKv(promptId, role, layer, "v"), &v}})
        writeKv(path, *tensor, referenceChunk(*tensor));
    m_referenceLayers[{promptId, role}].insert(layer);
}

void BundleWriter::addLogits(const std::string& promptId, LogitsRole role, const Logits& logits)
{
    prompt(promptId);
    const std::string path = bundle_path::logits(promptId, role);
    if (std::int64_t(logits.values.size()) != logits.steps * logits.vocab)
        fail(path, std::to_string(logits.values.size()) + " values for [" + std::to_string(logits.steps) + ", " +
                       std::to_string(logits.vocab) + "]");
    m_file->writeRaw(path, H5T_IEEE_F32LE, {logits.steps, logits.vocab}, logits.values.data(), 1);
}

void BundleWriter::writeStatePart(const std::string& group, const StatePart& part, bool withUnits)
{
    const std::string path = group + "/" + part.name;
    std::vector<std::int64_t> chunk = part.tensor.shape;
    chunk[0] = 1;  // a checkpoint per chunk: one is read without the others
    m_file->writeRawChunked(path, storageType(part.tensor.dtype), part.tensor.shape, part.tensor.bytes.data(), chunk);
    m_file->writeStringAttribute(path, "dtype", dtypeName(part.tensor.dtype));
    if (withUnits)
        m_file->writeRaw(path + "_units", H5T_STD_I64LE, {std::int64_t(part.units.size())}, part.units.data());
}

namespace {

// The record without its tensors' bytes: what finish() checks the sides by.
LayerStateRecord outlineOf(const LayerStateRecord& state)
{
    LayerStateRecord outline = state;
    for (auto& rank : outline.ranks)
        for (StatePart& part : rank)
            part.tensor.bytes = {};
    return outline;
}

}  // namespace

void BundleWriter::addEngineState(const std::string& promptId, const LayerStateRecord& state)
{
    prompt(promptId);
    const std::string path = bundle_path::engineState(promptId, state.layer);
    const int g = m_config.groupOf(state.layer);
    if (!validName(state.layer) || g < 0 || m_config.groups[std::size_t(g)].specName != "MambaSpec")
        fail(path, "layer '" + state.layer + "' is in no MambaSpec group of the config");
    if (m_engineStates.count({promptId, state.layer}))
        fail(path, "added twice");
    if (const std::string problem = stateRecordProblem(state, true); !problem.empty())
        fail(path, problem);
    m_file->createGroup(path);
    m_file->writeStringAttribute(path, "kind", state.kind);
    m_file->writeIntAttribute(path, "tp_size", std::int64_t(state.ranks.size()));
    m_file->writeRaw(path + "/positions", H5T_STD_I64LE, {std::int64_t(state.positions.size())}, state.positions.data());
    for (std::size_t r = 0; r < state.ranks.size(); ++r) {
        const std::string rankPath = path + "/rank_" + std::to_string(r);
        m_file->createGroup(rankPath);
        for (const StatePart& part : state.ranks[r])
            writeStatePart(rankPath, part, true);
    }
    m_engineStates.emplace(std::pair{promptId, state.layer}, outlineOf(state));
}

void BundleWriter::addReferenceState(const std::string& promptId, ReferenceRole role, const LayerStateRecord& state)
{
    prompt(promptId);
    const std::string path = bundle_path::referenceState(promptId, role, state.layer);
    if (m_engineOnly)
        fail(path, "an engine-only bundle holds no reference state");
    const int g = m_config.groupOf(state.layer);
    if (!validName(state.layer) || g < 0 || m_config.groups[std::size_t(g)].specName != "MambaSpec")
        fail(path, "layer '" + state.layer + "' is in no MambaSpec group of the config");
    if (m_referenceStates.count({promptId, role, state.layer}))
        fail(path, "added twice");
    if (const std::string problem = stateRecordProblem(state, false); !problem.empty())
        fail(path, problem);
    m_file->createGroup(path);
    m_file->writeRaw(path + "/positions", H5T_STD_I64LE, {std::int64_t(state.positions.size())}, state.positions.data());
    for (const StatePart& part : state.ranks[0])
        writeStatePart(path, part, false);
    m_referenceStates.emplace(std::tuple{promptId, role, state.layer}, outlineOf(state));
}

void BundleWriter::finish()
{
    for (const auto& [key, engine] : m_engineStates)
        for (ReferenceRole role : {ReferenceRole::Expected, ReferenceRole::Baseline}) {
            const std::string path = bundle_path::referenceState(key.first, role, key.second);
            const auto it = m_referenceStates.find({key.first, role, key.second});
            if (it == m_referenceStates.end()) {
                if (role == ReferenceRole::Expected && !m_engineOnly)
                    fail(path, "missing: the engine's state of this layer needs the expected reference's");
                continue;
            }
            if (const std::string problem = stateMismatchProblem(engine, it->second); !problem.empty())
                fail(path, problem);
        }
    for (const auto& [id, record] : m_prompts) {
        if (!m_snapshotCounts[id])
            fail(bundle_path::prompt(id), "has no engine snapshot");
        for (ReferenceRole role : {ReferenceRole::Expected, ReferenceRole::Baseline}) {
            const auto it = m_referenceLayers.find({id, role});
            if (m_engineOnly || (it == m_referenceLayers.end() && role == ReferenceRole::Baseline))
                continue;  // the baseline is optional, and an engine-only bundle has neither
            for (const std::string& layer : m_config.layerNames())
                if (it == m_referenceLayers.end() || !it->second.count(layer))
                    fail(bundle_path::referenceKv(id, role, layer, "k"), "missing: the " + referenceRoleName(role) +
                                                                             " reference must cover every layer");
        }
    }
    m_file.reset();
    if (std::rename(m_partialPath.c_str(), m_path.c_str()) != 0)
        fail({}, std::string("cannot move the finished bundle into place: ") + std::strerror(errno));
    m_finished = true;
}

}  // namespace kvscope
