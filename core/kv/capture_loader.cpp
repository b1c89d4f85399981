#include "kv/capture_loader.h"

#include "format/bundle_error.h"
#include "kv/reference_alignment.h"
#include "kv/snapshot_merge.h"

#include <algorithm>
#include <stdexcept>


namespace kvscope {

CaptureLoader::CaptureLoader(std::shared_ptr<const BundleReader> reader, UnreadableBlockPolicy policy,
                             std::shared_ptr<const BundleReader> referenceDonor)
    : m_members{{{}, std::move(reader)}}
    , m_policy(policy)
    , m_prompts(only().prompts())
{
    if (!referenceDonor || !only().metadata().engineOnly)
        return;
    m_donor = std::move(referenceDonor);
    for (PromptInfo& p : m_prompts) {
        if (!p.referenceMissing)
            continue;
        const auto& donors = m_donor->prompts();
        const auto donor = std::find_if(donors.begin(), donors.end(), [&](const PromptInfo& d) {
            return d.problems.empty() && d.inputIds == p.inputIds && d.teacherTokens == p.teacherTokens;
        });
        if (donor == donors.end()) {
            p.problems.back() = BundleError(only().path(), bundle_path::prompt(p.id),
                                            "an engine-only capture's prompt, and no readable prompt of " +
                                                m_donor->path() + " has its tokens to lend a reference")
                                    .what();
            continue;
        }
        p.problems.pop_back();  // the missing reference, the only problem (BundleReader puts it last)
        p.hasExpected = donor->hasExpected;
        p.hasBaseline = donor->hasBaseline;
        m_donorPrompt[p.id] = donor->id;
    }
}

CaptureLoader::CaptureLoader(std::vector<SweepMember> members, std::string label, UnreadableBlockPolicy policy)
    : m_members(std::move(members))
    , m_label(std::move(label))
    , m_policy(policy)
{
    if (m_members.empty() || m_label.empty())
        throw std::invalid_argument("a sweep needs a label and at least one bundle");
    for (std::size_t m = 0; m < m_members.size(); ++m)
        for (const PromptInfo& info : m_members[m].reader->prompts()) {
            PromptInfo named = info;
            named.id = m_members[m].name + "/" + info.id;
            if (!m_byName.emplace(named.id, m_prompts.size()).second)
                throw std::invalid_argument("two prompts of the sweep are named " + named.id);
            m_origin.emplace_back(m, info.id);
            m_prompts.push_back(std::move(named));
        }
}

const PromptInfo& CaptureLoader::prompt(const std::string& id) const
{
    if (!isSweep()) {
        const PromptInfo& info = only().prompt(id);
        return m_prompts[std::size_t(&info - only().prompts().data())];
    }
    const auto found = m_byName.find(id);
    if (found == m_byName.end())
        throw BundleError(m_label, "prompt '" + id + "'", "is not a prompt of this sweep (prompts are named BUNDLE/ID)");
    return m_prompts[found->second];
}

CaptureLoader::Located CaptureLoader::locate(const std::string& promptId) const
{
    if (!isSweep())
        return {only(), promptId};
    const std::pair<std::size_t, std::string>& origin = m_origin[std::size_t(&prompt(promptId) - m_prompts.data())];
    return {*m_members[origin.first].reader, origin.second};
}

std::size_t CaptureLoader::memberOf(const std::string& promptId) const
{
    return isSweep() ? m_origin[std::size_t(&prompt(promptId) - m_prompts.data())].first : 0;
}

BlockTable CaptureLoader::blockTable(const std::string& promptId, std::size_t snapshot, std::size_t group) const
{
    const Located at = locate(promptId);
    return at.reader.readBlockTable(at.id, snapshot, group);
}

Logits CaptureLoader::logits(const std::string& promptId, LogitsRole role) const
{
    const Located at = locate(promptId);
    return at.reader.readLogits(at.id, role);
}

std::optional<ImpactRecord> CaptureLoader::impact(const std::string& promptId) const
{
    const Located at = locate(promptId);
    return at.reader.readImpact(at.id);
}

PagedShard CaptureLoader::engineShard(const std::string& promptId, std::size_t snapshot, int rank, const std::string& layer,
                                      KvPart part, const std::vector<std::int64_t>& blockIds) const
{
    const Located at = locate(promptId);
    return at.reader.readEngineShard(at.id, snapshot, rank, layer, part, &blockIds);
}

std::string CaptureLoader::referenceOrigin(const std::string& promptId) const
{
    const auto [reader, fromId] = referenceFrom(promptId);
    return reader == &locate(promptId).reader ? reader->path() : reader->path() + ", prompt " + fromId;
}

std::int64_t CaptureLoader::sequenceLength(const std::string& promptId) const
{
    return prompt(promptId).snapshots.back().seqLen();
}

LayerShards CaptureLoader::readShards(const Located& at, std::size_t snapshot, const std::string& layer,
                                      const std::vector<std::int64_t>* blockIds) const
{
    const KvCacheConfig& config = at.reader.config();
    LayerShards shards;
    shards.k.resize(std::size_t(config.tpSize));
    shards.v.resize(std::size_t(config.tpSize));
    for (int rank : config.layoutOf(layer).ranksRead()) {
        shards.k[std::size_t(rank)] = at.reader.readEngineShard(at.id, snapshot, rank, layer, KvPart::K, blockIds, m_values);
        shards.v[std::size_t(rank)] = at.reader.readEngineShard(at.id, snapshot, rank, layer, KvPart::V, blockIds, m_values);
    }
    return shards;
}

const PromptInfo& CaptureLoader::usablePrompt(const std::string& promptId, bool engineOnly) const
{
    const PromptInfo& prompt = this->prompt(promptId);
    const Located at = locate(promptId);
    const bool noReferenceOnly = prompt.referenceMissing && prompt.problems.size() == 1 && at.reader.metadata().engineOnly;
    if (!prompt.problems.empty() && !(engineOnly && noReferenceOnly)) {
        throw BundleError(at.reader.path(), bundle_path::prompt(at.id), "cannot be analysed: " + prompt.problems.front());
    }
    return prompt;
}

int CaptureLoader::groupOf(const BundleReader& reader, const std::string& layer) const
{
    const KvCacheConfig& config = reader.config();
    const int group = config.groupOf(layer);
    if (group < 0)
        throw BundleError(reader.path(), "layer '" + layer + "'", "belongs to no group of the config");
    if (!config.isCompared(layer))
        throw BundleError(reader.path(), "layer '" + layer + "'",
                          "is one of the " + config.groups[std::size_t(group)].notComparedWhy +
                              ", which kvscope does not compare");
    return group;
}

LayerSource CaptureLoader::snapshotSource(const std::string& promptId, std::size_t snapshot, const std::string& layer,
                                          std::vector<std::string>* problems, std::int64_t length,
                                          PositionRange window) const
{
    const PromptInfo& prompt = usablePrompt(promptId, true);
    const Located at = locate(promptId);
    const KvCacheConfig& config = at.reader.config();  // a sweep's bundles may differ in their pool sizes
    const int group = groupOf(at.reader, layer);
    const SnapshotInfo& snap = prompt.snapshots.at(snapshot);
    const BlockTable table = at.reader.readBlockTable(at.id, snapshot, std::size_t(group));
    const std::int64_t written = snap.seqLen() - 1;
    const std::vector<std::int64_t> ids = requiredBlocks(config, layer, table, snap.batchRow, written, window);
    auto shards = std::make_shared<const LayerShards>(readShards(at, snapshot, layer, &ids));
    ReconstructOptions options{m_policy, at.reader.path(), bundle_path::snapshot(at.id, snapshot), m_values};
    return reconstructSource(config, layer, std::move(shards), table, snap.batchRow, written, options, problems, length,
                             window);
}

LayerKv CaptureLoader::engineLayer(const std::string& promptId, const std::string& layer,
                                   std::vector<std::string>* problems) const
{
    return engineSource(promptId, layer, problems).materialize();
}

LayerSource CaptureLoader::engineSource(const std::string& promptId, const std::string& layer,
                                        std::vector<std::string>* problems, PositionRange window) const
{
    const PromptInfo& prompt = usablePrompt(promptId, true);
    std::vector<SnapshotSpan> spans;
    for (const SnapshotInfo& s : prompt.snapshots)
        spans.push_back({s.seqLen(), s.validatedUntil});
    const Located at = locate(promptId);
    const std::vector<PositionRange> ranges =
        contributedRanges(spans, at.reader.path(), bundle_path::prompt(at.id) + "/engine");
    const KvCacheConfig& config = at.reader.config();
    const int group = groupOf(at.reader, layer);
    const KvCacheGroup& g = config.groups[std::size_t(group)];
    SnapshotMerger merger(g.totalKvHeads, sequenceLength(promptId), headDimsOf(g),
                          int(config.layout(g).contributingRanks().size()));
    for (std::size_t s = 0; s < prompt.snapshots.size(); ++s)
        if (const PositionRange range = ranges[s].clippedTo(window); !range.empty())  // its blocks in the window read, as whole reads do
            merger.add(snapshotSource(promptId, s, layer, problems, sequenceLength(promptId), window), range);
    return merger.take();
}

std::pair<const BundleReader*, std::string> CaptureLoader::referenceFrom(const std::string& promptId) const
{
    const auto borrowed = m_donorPrompt.find(promptId);
    if (borrowed == m_donorPrompt.end()) {
        const Located at = locate(promptId);
        return {&at.reader, at.id};
    }
    return {m_donor.get(), borrowed->second};
}

std::int64_t CaptureLoader::referencePositionsPerChunk(const std::string& promptId, ReferenceRole role,
                                                       const std::string& layer) const
{
    usablePrompt(promptId);
    const auto [reader, fromId] = referenceFrom(promptId);
    return reader->referenceExtent(fromId, role, layer).positionsPerChunk;
}

LayerKv CaptureLoader::referenceLayer(const std::string& promptId, ReferenceRole role, const std::string& layer) const
{
    return referenceSource(promptId, role, layer).materialize();
}

LayerSource CaptureLoader::referenceSource(const std::string& promptId, ReferenceRole role, const std::string& layer,
                                           PositionRange window) const
{
    usablePrompt(promptId);
    const Located at = locate(promptId);
    const KvCacheConfig& config = at.reader.config();
    const int group = groupOf(at.reader, layer);
    const auto [reader, fromId] = referenceFrom(promptId);
    const BundleReader& from = *reader;
    std::shared_ptr<const BundleReader::Reference> ref;
    if (window == PositionRange::all()) {
        ref = std::make_shared<const BundleReader::Reference>(from.readReference(fromId, role, layer, m_values));
    } else {
        const PositionRange rows =
            referenceRowsFor(window, from.referenceExtent(fromId, role, layer).seq, sequenceLength(promptId));
        ref = std::make_shared<const BundleReader::Reference>(
            from.readReferenceRows(fromId, role, layer, rows.begin, rows.end, m_values));
    }
    LayerSource source = alignReferenceSource(ref->k, ref->v, ref->batchRow, config, config.groups[std::size_t(group)],
                                              sequenceLength(promptId), from.path(),
                                              bundle_path::referenceKv(fromId, role, layer, "k"), ref->slab);
    source.storage.push_back(std::move(ref));
    return source;
}

LayerState CaptureLoader::layerState(const std::string& promptId, const std::string& layer) const
{
    const Located at = locate(promptId);
    return loadLayerState(at.reader, at.id, layer);
}

std::pair<LayerStateRecord, std::optional<LayerStateRecord>> CaptureLoader::stateLayout(const std::string& promptId,
                                                                                        const std::string& layer) const
{
    const Located at = locate(promptId);
    return {at.reader.readEngineStateLayout(at.id, layer),
            at.reader.readReferenceStateLayout(at.id, ReferenceRole::Expected, layer)};
}

std::optional<LayerStateRecord> CaptureLoader::referenceState(const std::string& promptId, ReferenceRole role,
                                                              const std::string& layer) const
{
    const Located at = locate(promptId);
    return at.reader.readReferenceState(at.id, role, layer);
}

}  // namespace kvscope
