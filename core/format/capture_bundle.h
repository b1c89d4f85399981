#pragma once
// What a capture bundle holds (format v2, see docs/bundle-format.md), as plain values,
// and the HDF5 paths where each piece lives. Shared by the reader and the writer.

#include "format/provenance.h"
#include "format/raw_tensor.h"

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace kvscope {

inline constexpr const char* kBundleFormatName = "kvscope-capture";
// What the writers write; the reader also reads every version from the oldest on.
inline constexpr int kBundleFormatVersion = 2;
inline constexpr int kOldestBundleFormatVersion = 1;

enum class ReferenceRole { Expected, Baseline };
enum class LogitsRole { Expected, Actual, Baseline };
std::string referenceRoleName(ReferenceRole role);
std::string logitsRoleName(LogitsRole role);

struct BundleMetadata {
    std::string model;
    std::string engine;
    std::string created;  // ISO 8601, UTC
    std::string notes;
    // Further string attributes of the root group (for example a synthetic capture's fault).
    std::map<std::string, std::string> extra;
    std::string writer;  // what wrote the file ("kvscope 0.2.0"): set by the writers, not by callers
    int formatVersion = kBundleFormatVersion;  // as read from the file
    // No reference KV in any prompt (root attribute engine_only = 1): the engine's side of an
    // A/B comparison, compared against the reference of another capture of the same prompts
    // (kvscope diff A B borrows A's).
    bool engineOnly = false;
};

struct SnapshotInfo {
    std::int64_t batchRow = 0;
    std::vector<std::int64_t> seqLens;  // per block-table row; -1 = unknown
    std::int64_t validatedUntil = 0;    // exclusive; see snapshot_merge.h
    bool subsetStored = false;                 // physical_block_ids present: only those blocks are stored
    std::vector<std::int64_t> storedBlockIds;  // their ids, in row order (may be empty)

    std::int64_t seqLen() const { return seqLens.at(std::size_t(batchRow)); }
};

struct PromptInfo {
    std::string id;
    std::int64_t promptLen = 0;
    std::vector<std::int64_t> inputIds;
    std::vector<std::int64_t> teacherTokens;
    bool hasDivergences = false;  // divergence positions were recorded (possibly none)
    std::vector<std::int64_t> divergencePositions;  // absolute positions
    std::vector<std::string> tokenStrings;           // per absolute position, may be empty
    std::vector<ProvenanceRange> provenance;         // where each position's KV came from, may be empty
    std::vector<SnapshotInfo> snapshots;
    bool hasExpected = false;
    bool hasBaseline = false;
    // The expected reference is missing, and that is the prompt's only problem (the last of them):
    // an engine-only capture's prompts, which can lend another capture's reference.
    bool referenceMissing = false;
    std::vector<LogitsRole> logits;
    // The state-space layers whose recurrent state the engine's side holds (engine/states/<L>).
    std::vector<std::string> stateLayers;
    // The engine's KV put into the reference was measured (prompts/<id>/impact).
    bool hasImpact = false;
    // Structural problems found on open; a prompt with problems cannot be analysed.
    std::vector<std::string> problems;
};

struct Logits {
    std::int64_t steps = 0;
    std::int64_t vocab = 0;
    std::vector<float> values;  // [steps, vocab]; step g predicts position prompt_len + g
};

// HDF5 paths of format v1 and v2 (the same paths).
namespace bundle_path {
inline constexpr const char* kConfig = "/kv_cache_config";
inline constexpr const char* kPrompts = "/prompts";
std::string prompt(const std::string& id);
std::string snapshot(const std::string& id, std::size_t index);
std::string blockTable(const std::string& id, std::size_t snapshotIndex, std::size_t group);
std::string engineKv(const std::string& id, std::size_t snapshotIndex, int rank, const std::string& layer,
                     const char* part);
std::string referenceRole(const std::string& id, ReferenceRole role);
std::string referenceKv(const std::string& id, ReferenceRole role, const std::string& layer, const char* part);
std::string logits(const std::string& id, LogitsRole role);
// A state-space layer's recurrent state: the engine's (rank_<r>/<part> inside), a reference role's.
std::string engineStates(const std::string& id);
std::string engineState(const std::string& id, const std::string& layer);
std::string referenceState(const std::string& id, ReferenceRole role, const std::string& layer);
}  // namespace bundle_path

}  // namespace kvscope
