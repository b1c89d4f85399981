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
//
// A sweep (many bundles of one model, written by many engine workers) is one loader over
// several bundles: their prompts are named "NAME/ID", and each is read from its own bundle
// (kv/sweep.h opens one).

#include "format/bundle_reader.h"
#include "kv/layer_kv.h"
#include "kv/layer_source.h"
#include "kv/position_range.h"
#include "kv/reconstruction.h"

#include <map>
#include <utility>
#include <memory>
#include "kv/layer_state.h"
#include <optional>
#include <string>
#include <vector>

namespace kvscope {

// One bundle of a sweep, and the name its prompts carry ("NAME/ID").
struct SweepMember {
    std::string name;
    std::shared_ptr<const BundleReader> reader;
};

class CaptureLoader {
public:
    explicit CaptureLoader(std::shared_ptr<const BundleReader> reader,
                           UnreadableBlockPolicy policy = UnreadableBlockPolicy::Error,
                           std::shared_ptr<const BundleReader> referenceDonor = nullptr);
    // A sweep: `members` (at least one, whose configs agree but for their pool sizes), called
    // `label` where a bundle's path would be.
    CaptureLoader(std::vector<SweepMember> members, std::string label, UnreadableBlockPolicy policy);

    // The bundle's path; a sweep's label.
    const std::string& path() const { return m_label.empty() ? m_members.front().reader->path() : m_label; }
    // The (first) bundle's.
    const BundleMetadata& metadata() const { return m_members.front().reader->metadata(); }
    const KvCacheConfig& config() const { return m_members.front().reader->config(); }
    bool isSweep() const { return !m_label.empty(); }
    const std::vector<SweepMember>& members() const { return m_members; }
    // Which member holds the prompt (0 for one bundle).
    std::size_t memberOf(const std::string& promptId) const;
    // The bundle's, with a borrowed reference's roles (hasExpected, hasBaseline) where there is one.
    const std::vector<PromptInfo>& prompts() const { return m_prompts; }
    const PromptInfo& prompt(const std::string& id) const;  // throws if unknown
    // Where a prompt's reference is read: this bundle, or the donor's file and prompt it borrows.
    std::string referenceOrigin(const std::string& promptId) const;
    UnreadableBlockPolicy unreadableBlocks() const { return m_policy; }
    // LayoutOnly: the sources made after this hold which positions are present and where, every
    // structural check made, but no values (none read, none decoded: kvscope inspect).
    void setValueRead(ValueRead values) { m_values = values; }
    BundleOutline outline() const { return m_members.front().reader->outline(); }
    // false: only an outline (a results file's)
    bool holdsData() const { return m_members.front().reader->holdsData(); }

    BlockTable blockTable(const std::string& promptId, std::size_t snapshot, std::size_t group) const;
    Logits logits(const std::string& promptId, LogitsRole role) const;
    // The prompt's impact record (nullopt: none measured); see BundleReader::readImpact.
    std::optional<ImpactRecord> impact(const std::string& promptId) const;
    // One rank's K or V of a layer as stored, only the blocks `blockIds` (see BundleReader).
    PagedShard engineShard(const std::string& promptId, std::size_t snapshot, int rank, const std::string& layer,
                           KvPart part, const std::vector<std::int64_t>& blockIds) const;

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
    // A state-space layer's recurrent state, both sides (kv/layer_state.h); a reference role's
    // state alone (nullopt: the role holds none for the layer).
    LayerState layerState(const std::string& promptId, const std::string& layer) const;
    std::optional<LayerStateRecord> referenceState(const std::string& promptId, ReferenceRole role,
                                                   const std::string& layer) const;
    // The engine's and the expected reference's state without values (shapes, checkpoints).
    std::pair<LayerStateRecord, std::optional<LayerStateRecord>> stateLayout(const std::string& promptId,
                                                                             const std::string& layer) const;

private:
    // The bundle holding a prompt, and the prompt's id there.
    struct Located {
        const BundleReader& reader;
        const std::string& id;
    };
    Located locate(const std::string& promptId) const;
    // The prompt, or a BundleError when its structure was found broken on open. `engineOnly`:
    // only its engine data is read, so an engine-only capture's prompt whose one problem is
    // that it holds no reference is usable too.
    const PromptInfo& usablePrompt(const std::string& promptId, bool engineOnly = false) const;
    int groupOf(const BundleReader& reader, const std::string& layer) const;  // throws for a layer of no group
    // One snapshot: positions [0, seq_len - 1) (the last token is never written), in
    // `length` positions (the rest absent).
    LayerSource snapshotSource(const std::string& promptId, std::size_t snapshot, const std::string& layer,
                               std::vector<std::string>* problems, std::int64_t length, PositionRange window) const;
    LayerShards readShards(const Located& at, std::size_t snapshot, const std::string& layer,
                           const std::vector<std::int64_t>* blockIds) const;

    std::vector<SweepMember> m_members;  // one, unless a sweep
    std::string m_label;                 // a sweep's; empty for one bundle
    UnreadableBlockPolicy m_policy;
    ValueRead m_values = ValueRead::Values;
    // The readers', in their order, with borrowed references' roles (and a sweep's names).
    std::vector<PromptInfo> m_prompts;
    // A sweep's: per prompt, its member and its id there; the index of each name.
    std::vector<std::pair<std::size_t, std::string>> m_origin;
    std::map<std::string, std::size_t> m_byName;
    std::shared_ptr<const BundleReader> m_donor;
    std::map<std::string, std::string> m_donorPrompt;  // prompt id -> the donor's prompt of the same tokens
    // Where a prompt's reference is read: this bundle's prompt, or the donor's it borrows.
    std::pair<const BundleReader*, std::string> referenceFrom(const std::string& promptId) const;
    const BundleReader& only() const { return *m_members.front().reader; }
};

}  // namespace kvscope
