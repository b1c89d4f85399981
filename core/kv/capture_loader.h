#pragma once
// The one way into a bundle for the analysis and the app: what the bundle describes (its
// config, prompts, metadata), its logits and block tables, and contiguous, aligned KV for one
// layer of one prompt: the engine side (every snapshot reconstructed, TP-merged and merged)
// and the reference side (aligned to the engine's positions). Reads only the blocks a layer
// needs. Thread-safe (the reader serialises libhdf5).
//
// An engine-only capture (BundleMetadata::engineOnly) has no reference of its own; given a
// donor, a capture of the same prompts, each prompt borrows the reference of the donor's
// prompt with the same tokens, as kvscope diff A B does with A's.

#include "format/bundle_reader.h"
#include "kv/layer_kv.h"
#include "kv/layer_source.h"
#include "kv/position_range.h"
#include "kv/reconstruction.h"

#include <map>
#include <utility>
#include <memory>
#include <string>
#include <vector>

namespace kvscope {

class CaptureLoader {
public:
    explicit CaptureLoader(std::shared_ptr<const BundleReader> reader,
                           UnreadableBlockPolicy policy = UnreadableBlockPolicy::Error,
                           std::shared_ptr<const BundleReader> referenceDonor = nullptr);

    const std::string& path() const { return m_reader->path(); }
    const BundleMetadata& metadata() const { return m_reader->metadata(); }
    const KvCacheConfig& config() const { return m_reader->config(); }
    // The bundle's, with a borrowed reference's roles (hasExpected, hasBaseline) where there is one.
    const std::vector<PromptInfo>& prompts() const { return m_prompts; }
    const PromptInfo& prompt(const std::string& id) const;  // throws if unknown
    // Where a prompt's reference is read: this bundle, or the donor's file and prompt it borrows.
    std::string referenceOrigin(const std::string& promptId) const;
    UnreadableBlockPolicy unreadableBlocks() const { return m_policy; }
    BundleOutline outline() const { return m_reader->outline(); }
    bool holdsData() const { return m_reader->holdsData(); }  // false: only an outline (a results file's)

    BlockTable blockTable(const std::string& promptId, std::size_t snapshot, std::size_t group) const
    {
        return m_reader->readBlockTable(promptId, snapshot, group);
    }
    Logits logits(const std::string& promptId, LogitsRole role) const { return m_reader->readLogits(promptId, role); }
    // One rank's K or V of a layer as stored, only the blocks `blockIds` (see BundleReader).
    PagedShard engineShard(const std::string& promptId, std::size_t snapshot, int rank, const std::string& layer,
                           KvPart part, const std::vector<std::int64_t>& blockIds) const
    {
        return m_reader->readEngineShard(promptId, snapshot, rank, layer, part, &blockIds);
    }

    // Positions of the merged engine cache: the last snapshot's sequence length.
    std::int64_t sequenceLength(const std::string& promptId) const;
    // All snapshots merged (see snapshot_merge.h), sequenceLength() positions.
    LayerKv engineLayer(const std::string& promptId, const std::string& layer,
                        std::vector<std::string>* problems = nullptr) const;
    // The same, left in the blocks as read (decoded row by row). With a `window`, only the
    // blocks that hold its positions are read, and only its positions are present (a long
    // context is compared a window of tokens at a time).
    LayerSource engineSource(const std::string& promptId, const std::string& layer,
                             std::vector<std::string>* problems = nullptr,
                             PositionRange window = PositionRange::all()) const;
    // The reference aligned to sequenceLength() positions.
    LayerKv referenceLayer(const std::string& promptId, ReferenceRole role, const std::string& layer) const;
    // How many positions a chunk of the reference holds (0: not chunked): a window shorter than
    // that reads whole chunks for a part of them.
    std::int64_t referencePositionsPerChunk(const std::string& promptId, ReferenceRole role, const std::string& layer) const;
    // The same, left as stored (decoded row by row); with a `window`, only its positions read.
    LayerSource referenceSource(const std::string& promptId, ReferenceRole role, const std::string& layer,
                                PositionRange window = PositionRange::all()) const;

private:
    // The prompt, or a BundleError when its structure was found broken on open.
    const PromptInfo& usablePrompt(const std::string& promptId) const;
    int groupOf(const std::string& layer) const;  // throws for a layer of no group
    // One snapshot: positions [0, seq_len - 1) (the last token is never written), in
    // `length` positions (the rest absent).
    LayerSource snapshotSource(const std::string& promptId, std::size_t snapshot, const std::string& layer,
                               std::vector<std::string>* problems, std::int64_t length, PositionRange window) const;
    LayerShards readShards(const std::string& promptId, std::size_t snapshot, const std::string& layer,
                           const std::vector<std::int64_t>* blockIds) const;

    std::shared_ptr<const BundleReader> m_reader;
    UnreadableBlockPolicy m_policy;
    std::vector<PromptInfo> m_prompts;  // the reader's, in its order, with borrowed references' roles
    std::shared_ptr<const BundleReader> m_donor;
    std::map<std::string, std::string> m_donorPrompt;  // prompt id -> the donor's prompt of the same tokens
    // Where a prompt's reference is read: this bundle's prompt, or the donor's it borrows.
    std::pair<const BundleReader*, std::string> referenceFrom(const std::string& promptId) const;
};

}  // namespace kvscope
