#pragma once
// Reads a capture bundle, format v2 (and v1). Opening reads only the small things (metadata, config,
// per-prompt tokens and the snapshot list) and checks the structure; tensors are read
// lazily, one layer's K or V of one rank at a time, and only the blocks asked for.
// Thread-safe: HDF5 calls are serialised internally.

#include "format/bundle_outline.h"
#include "format/capture_bundle.h"
#include "format/hdf5_file.h"
#include "format/impact_record.h"
#include "format/kv_cache_config.h"
#include "format/paged_kv.h"
#include "format/recurrent_state.h"

#include <array>
#include <chrono>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace kvscope {

class BundleReader {
public:
    // Throws BundleError when the file is not a v1 bundle or its config is invalid.
    // Problems confined to one prompt are recorded in that prompt's `problems` instead.
    explicit BundleReader(const std::string& path);
    // Stands in for a bundle that is not at hand (a results file keeps its outline): metadata,
    // config and prompts as the bundle had them; every read of data throws a BundleError
    // saying that the bundle itself is needed.
    explicit BundleReader(BundleOutline outline);
    ~BundleReader();
    BundleReader(const BundleReader&) = delete;
    BundleReader& operator=(const BundleReader&) = delete;

    const std::string& path() const { return m_path; }
    const BundleMetadata& metadata() const { return m_metadata; }
    const KvCacheConfig& config() const { return m_config; }
    const std::vector<PromptInfo>& prompts() const { return m_prompts; }
    const PromptInfo& prompt(const std::string& id) const;  // throws if unknown
    // Whether tensors and block tables can be read (false for a reader made from an outline).
    bool holdsData() const { return m_file.isOpen(); }
    BundleOutline outline() const;

    BlockTable readBlockTable(const std::string& promptId, std::size_t snapshot, std::size_t group) const;
    // One rank's K or V of one layer. With `blockIds`, only those physical blocks (the ones
    // the bundle stores; others are left out for reconstruction to report).
    PagedShard readEngineShard(const std::string& promptId, std::size_t snapshot, int rank, const std::string& layer,
                               KvPart part, const std::vector<std::int64_t>* blockIds = nullptr,
                               ValueRead values = ValueRead::Values) const;
    // The reference K and V of one layer, [batch, heads, seq, head_dim], and the batch row to use;
    // or, with a slab, only positions [firstRow, firstRow + rows) of that row (see ReferenceSlab).
    struct Reference {
        RawTensor k;
        RawTensor v;
        std::int64_t batchRow = 0;
        std::optional<ReferenceSlab> slab;
    };
    Reference readReference(const std::string& promptId, ReferenceRole role, const std::string& layer,
                            ValueRead values = ValueRead::Values) const;
    // The positions `rows` (clipped to those stored) of the prompt's batch row: a window of
    // tokens reads only the chunks that hold it.
    Reference readReferenceRows(const std::string& promptId, ReferenceRole role, const std::string& layer,
                                std::int64_t firstRow, std::int64_t endRow, ValueRead values = ValueRead::Values) const;
    // The positions a reference holds (its seq), and how many of them a chunk holds (the most of
    // K's and V's; 0 when not chunked): what reading a window of them costs.
    struct ReferenceExtent {
        std::int64_t seq = 0;
        std::int64_t positionsPerChunk = 0;
    };
    ReferenceExtent referenceExtent(const std::string& promptId, ReferenceRole role, const std::string& layer) const;
    Logits readLogits(const std::string& promptId, LogitsRole role) const;
    // What the engine's KV does to the reference's output (PromptInfo::hasImpact; nullopt without
    // one), checked (format/impact_record.h): a problem throws a BundleError naming the object.
    std::optional<ImpactRecord> readImpact(const std::string& promptId) const;
    // A state-space layer's recurrent state (PromptInfo::stateLayers): the engine's ranks, and a
    // reference role's whole state (nullopt when the role holds none for the layer). Each
    // checked on its own (stateRecordProblem); a problem throws a BundleError naming the object.
    LayerStateRecord readEngineState(const std::string& promptId, const std::string& layer) const;
    // The same without the values (each part's dtype and shape, no bytes): what inspect lists.
    LayerStateRecord readEngineStateLayout(const std::string& promptId, const std::string& layer) const;
    std::optional<LayerStateRecord> readReferenceStateLayout(const std::string& promptId, ReferenceRole role,
                                                             const std::string& layer) const;
    std::optional<LayerStateRecord> readReferenceState(const std::string& promptId, ReferenceRole role,
                                                       const std::string& layer) const;

    // Checks every dataset's presence, shape and dtype (no tensor data is read). Returns
    // one message per problem, each naming the file and the object.
    std::vector<std::string> validate() const;

    // Opens `path` (and validates a v1 bundle) in a forked child first: libhdf5 can crash (a segmentation
    // fault inside the library) on corrupt metadata before any check of ours runs, and a
    // process that reads in-process (the app) must not die of it. Throws BundleError when the
    // child crashed or was still reading after `limit` (libhdf5 looping; reading a bundle's
    // metadata takes well under a second); any other outcome is left to the real open.
    // `inChild` runs in the child before it reads (tests use it to simulate a crash or a hang).
    // Whether probeInChild may be called from a process that runs other threads (the app): not
    // under ThreadSanitizer (no fork with threads at all), nor under GCC 12's AddressSanitizer
    // (its allocator's locks are not reset in the child, which then waits on them for ever).
#if defined(__SANITIZE_THREAD__) || defined(__SANITIZE_ADDRESS__)
    static constexpr bool kProbeFromThreads = false;
#else
    static constexpr bool kProbeFromThreads = true;
#endif
    static void probeInChild(const std::string& path, const std::function<void()>& inChild = {},
                             std::chrono::milliseconds limit = std::chrono::minutes(1));

private:
    // Throws when this reader stands for a bundle that is not at hand.
    void requireData() const;
    PromptInfo readPrompt(const std::string& id) const;
    // Reads straight from the file are left in `deferred`, for the caller to run without the lock.
    // The scales beside a quantised engine cache (`<dataset>_scale`), if any, into `cache`;
    // `rows` as for the cache.
    void readScales(const std::string& dataset, const std::vector<std::int64_t>& shape,
                    const std::vector<std::int64_t>* rows, RawTensor& cache) const;
    // NVFP4's e4m3 block scales, or int4 per token and head's scales, zero points and RHT signs.
    // A cache's float32 scales at `path` (of the stored rows), finite and positive (or zero
    // where `zeroAllowed`).
    std::vector<float> readFloatScales(const std::string& path, const std::vector<std::int64_t>& shape,
                                       const std::vector<std::int64_t>* rows, bool zeroAllowed) const;
    void readPackedScales(const std::string& dataset, const std::vector<std::int64_t>& shape,
                          const std::vector<std::int64_t>* rows, RawTensor& cache) const;
    // A one-byte integer dataset of `shape` (rows of it, as for the cache), read now.
    std::vector<std::uint8_t> readBytes(const std::string& path, const std::vector<std::int64_t>& shape, bool isSigned,
                                        const std::vector<std::int64_t>* rows) const;
    // Throws when a 4-bit cache holds a byte above 15 (naming where).
    void requireCodes(const std::string& dataset, const PagedShard& shard) const;
    // A reference's K and V datasets, their shapes and declared sizes checked (under the HDF5
    // lock), and its batch row.
    struct ReferenceDatasets {
        std::int64_t batchRow = 0;
        std::array<std::string, 2> paths;  // [K, V]
        std::array<std::vector<std::int64_t>, 2> shapes;
    };
    ReferenceDatasets referenceDatasets(const std::string& promptId, ReferenceRole role, const std::string& layer) const;
    // A tensor's dtype and scale, without its data.
    RawTensor storedAs(const std::string& dataset) const;
    RawTensor readTensor(const std::string& dataset, const std::vector<std::int64_t>& expectedShape,
                         const std::vector<std::int64_t>* rows, std::vector<ChunkRowRead>& deferred,
                         ValueRead values = ValueRead::Values) const;
    DType checkedDType(const std::string& dataset) const;
    // A dataset's shape, type and chunks, and what checkedDType and storedAs found of it: kept,
    // since validating the bundle, laying out its positions and every read of the dataset ask
    // again (each asking opens it and its attributes). A bundle is read only: what was found
    // stays true. Failures are not kept. Under the HDF5 lock, as every use of m_file.
    const DatasetInfo& datasetInfo(const std::string& dataset) const;
    struct KnownDataset {
        std::optional<DType> dtype;  // once checkedDType has checked it
        std::optional<float> scale;  // once storedAs has (1 when there is none)
    };
    // The parts in a state's group (rank_<r>/ or a reference's), their units when `engine`.
    // Without `values`, each part's dtype and shape only (no bytes).
    std::vector<StatePart> readStateParts(const std::string& group, bool engine, std::vector<ChunkRowRead>& reads,
                                          bool values = true) const;
    LayerStateRecord readEngineState(const std::string& promptId, const std::string& layer, bool values) const;
    std::optional<LayerStateRecord> readReferenceState(const std::string& promptId, ReferenceRole role,
                                                       const std::string& layer, bool values) const;
    std::vector<std::int64_t> engineShardShape(const PromptInfo& prompt, std::size_t snapshot,
                                               const std::string& layer, KvPart part) const;
    std::vector<std::int64_t> referenceShape(const std::string& dataset, const std::string& layer, KvPart part) const;

    std::string m_path;
    Hdf5File m_file;
    BundleMetadata m_metadata;
    KvCacheConfig m_config;
    std::vector<PromptInfo> m_prompts;
    std::uint64_t m_bytes = 0;  // the file's size
    mutable std::unordered_map<std::string, DatasetInfo> m_datasetInfos;
    mutable std::unordered_map<std::string, KnownDataset> m_known;
};

}  // namespace kvscope
