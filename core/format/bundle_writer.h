#pragma once
// Writes a capture bundle, format v2. Everything handed in is checked against the KV cache
// config first, so that a bundle this writer finishes is one the reader accepts. The file
// is written under a temporary name and appears under its own only when finish() succeeds.

#include "format/capture_bundle.h"
#include "format/hdf5_file.h"
#include "format/kv_cache_config.h"
#include "format/paged_kv.h"
#include "format/recurrent_state.h"

#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

namespace kvscope {

struct PromptRecord {
    std::string id;
    std::vector<std::int64_t> inputIds;  // the prompt; prompt_len = its length
    std::vector<std::int64_t> teacherTokens;
    std::optional<std::vector<std::int64_t>> divergencePositions;  // absolute positions
    std::vector<std::string> tokenStrings;  // empty, or one per position of prompt + teacher tokens
    std::string provenance;  // the `provenance` attribute's JSON (format/provenance.h); empty: none
};

// One generate call's engine state, as the engine hands it over.
struct EngineSnapshot {
    std::int64_t batchRow = 0;
    std::vector<std::int64_t> seqLens;  // per block-table row, -1 = unknown
    std::optional<std::int64_t> validatedUntil;  // default: seqLen - 1 (every written position)
    std::vector<BlockTable> blockTables;         // one per group
    // ranks[r][layer] = {k, v}, each [blocks, heads_per_rank, block_size, head_size].
    std::vector<std::map<std::string, std::pair<RawTensor, RawTensor>>> ranks;
    // Empty: the tensors hold every physical block (num_blocks rows). Otherwise the physical
    // id of each row the tensors hold.
    std::vector<std::int64_t> storedBlockIds;
    // Store only the blocks some block-table entry references (tensors must hold all blocks).
    bool keepOnlyReferencedBlocks = false;
};

// How a reference [batch, heads, positions, width] is chunked: a batch row as one chunk up to
// kWholeReferenceChunk positions (read whole, straight from the file, by the analysis of a
// layer that fits one window); past that, chunks of about 1 MiB along the positions, so that a
// window of tokens of a long context reads only its own.
inline constexpr std::int64_t kWholeReferenceChunk = 4096;
std::vector<std::int64_t> referenceChunk(const RawTensor& tensor);

class BundleWriter {
public:
    BundleWriter(std::string path, const BundleMetadata& metadata, const KvCacheConfig& config);
    ~BundleWriter();  // without finish(), removes the partial file

    void addPrompt(const PromptRecord& prompt);
    void addSnapshot(const std::string& promptId, const EngineSnapshot& snapshot);
    void addReference(const std::string& promptId, ReferenceRole role, const std::string& layer, const RawTensor& k,
                      const RawTensor& v, std::int64_t batchRow = 0);
    void addLogits(const std::string& promptId, LogitsRole role, const Logits& logits);
    // A state-space layer's recurrent state (docs/bundle-format.md, "Recurrent state"): the
    // engine's per rank, and the reference's whole; checked against each other at finish().
    void addEngineState(const std::string& promptId, const LayerStateRecord& state);
    void addReferenceState(const std::string& promptId, ReferenceRole role, const LayerStateRecord& state);
    // A further metadata attribute of the root group (see BundleMetadata::extra).
    void setMetadata(const std::string& key, const std::string& value);
    void finish();

private:
    [[noreturn]] void fail(const std::string& object, const std::string& problem) const;
    // In checksummed chunks of `chunk` (finer scales beside it in chunks of its rows).
    void writeKv(const std::string& dataset, const RawTensor& tensor, const std::vector<std::int64_t>& chunk);
    const PromptRecord& prompt(const std::string& id) const;

    std::string m_path;
    std::string m_partialPath;
    KvCacheConfig m_config;
    std::unique_ptr<Hdf5File> m_file;
    bool m_engineOnly = false;
    std::map<std::string, PromptRecord> m_prompts;
    std::map<std::string, std::size_t> m_snapshotCounts;
    std::map<std::pair<std::string, ReferenceRole>, std::set<std::string>> m_referenceLayers;
    // The states added (their tensors' bytes dropped), by prompt and layer, to check the sides
    // against each other at finish().
    void writeStatePart(const std::string& group, const StatePart& part, bool withUnits);
    std::map<std::pair<std::string, std::string>, LayerStateRecord> m_engineStates;
    std::map<std::tuple<std::string, ReferenceRole, std::string>, LayerStateRecord> m_referenceStates;
    bool m_finished = false;
};

}  // namespace kvscope
