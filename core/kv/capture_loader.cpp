#include "kv/capture_loader.h"

#include "format/bundle_error.h"
#include "kv/reference_alignment.h"
#include "kv/snapshot_merge.h"

#include <algorithm>


namespace kvscope {

CaptureLoader::CaptureLoader(std::shared_ptr<const BundleReader> reader, UnreadableBlockPolicy policy,
                             std::shared_ptr<const BundleReader> referenceDonor)
    : m_reader(std::move(reader))
    , m_policy(policy)
    , m_prompts(m_reader->prompts())
{
    if (!referenceDonor || !m_reader->metadata().engineOnly)
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
            p.problems.back() = BundleError(m_reader->path(), bundle_path::prompt(p.id),
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

const PromptInfo& CaptureLoader::prompt(const std::string& id) const
{
    const PromptInfo& info = m_reader->prompt(id);
    return m_prompts[std::size_t(&info - m_reader->prompts().data())];
}

std::string CaptureLoader::referenceOrigin(const std::string& promptId) const
{
    const auto [reader, fromId] = referenceFrom(promptId);
    return reader == m_reader.get() ? reader->path() : reader->path() + ", prompt " + fromId;
}

std::int64_t CaptureLoader::sequenceLength(const std::string& promptId) const
{
    return m_reader->prompt(promptId).snapshots.back().seqLen();
}

LayerShards CaptureLoader::readShards(const std::string& promptId, std::size_t snapshot, const std::string& layer,
                                      const std::vector<std::int64_t>* blockIds) const
{
    const KvCacheConfig& config = m_reader->config();
    LayerShards shards;
    shards.k.resize(std::size_t(config.tpSize));
    shards.v.resize(std::size_t(config.tpSize));
    for (int rank : config.layoutOf(layer).ranksRead()) {
        shards.k[std::size_t(rank)] = m_reader->readEngineShard(promptId, snapshot, rank, layer, KvPart::K, blockIds);
        shards.v[std::size_t(rank)] = m_reader->readEngineShard(promptId, snapshot, rank, layer, KvPart::V, blockIds);
    }
    return shards;
}

const PromptInfo& CaptureLoader::usablePrompt(const std::string& promptId) const
{
    const PromptInfo& prompt = this->prompt(promptId);
    if (!prompt.problems.empty())
        throw BundleError(m_reader->path(), bundle_path::prompt(promptId), "cannot be analysed: " + prompt.problems.front());
    return prompt;
}

int CaptureLoader::groupOf(const std::string& layer) const
{
    const int group = m_reader->config().groupOf(layer);
    if (group < 0)
        throw BundleError(m_reader->path(), "layer '" + layer + "'", "belongs to no group of the config");
    if (!m_reader->config().isCompared(layer))
        throw BundleError(m_reader->path(), "layer '" + layer + "'",
                          "is one of the " + m_reader->config().groups[std::size_t(group)].notComparedWhy +
                              ", which kvscope does not compare");
    return group;
}

LayerSource CaptureLoader::snapshotSource(const std::string& promptId, std::size_t snapshot, const std::string& layer,
                                          std::vector<std::string>* problems, std::int64_t length,
                                          PositionRange window) const
{
    const PromptInfo& prompt = usablePrompt(promptId);
    const KvCacheConfig& config = m_reader->config();
    const int group = groupOf(layer);
    const SnapshotInfo& snap = prompt.snapshots.at(snapshot);
    const BlockTable table = m_reader->readBlockTable(promptId, snapshot, std::size_t(group));
    const std::int64_t written = snap.seqLen() - 1;
    const std::vector<std::int64_t> ids = requiredBlocks(config, layer, table, snap.batchRow, written, window);
    auto shards = std::make_shared<const LayerShards>(readShards(promptId, snapshot, layer, &ids));
    ReconstructOptions options{m_policy, m_reader->path(), bundle_path::snapshot(promptId, snapshot)};
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
    const PromptInfo& prompt = usablePrompt(promptId);
    std::vector<SnapshotSpan> spans;
    for (const SnapshotInfo& s : prompt.snapshots)
        spans.push_back({s.seqLen(), s.validatedUntil});
    const std::vector<PositionRange> ranges =
        contributedRanges(spans, m_reader->path(), bundle_path::prompt(promptId) + "/engine");
    const KvCacheConfig& config = m_reader->config();
    const int group = groupOf(layer);
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
    if (borrowed == m_donorPrompt.end())
        return {m_reader.get(), promptId};
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
    const KvCacheConfig& config = m_reader->config();
    const int group = groupOf(layer);
    const auto [reader, fromId] = referenceFrom(promptId);
    const BundleReader& from = *reader;
    std::shared_ptr<const BundleReader::Reference> ref;
    if (window == PositionRange::all()) {
        ref = std::make_shared<const BundleReader::Reference>(from.readReference(fromId, role, layer));
    } else {
        const PositionRange rows =
            referenceRowsFor(window, from.referenceExtent(fromId, role, layer).seq, sequenceLength(promptId));
        ref = std::make_shared<const BundleReader::Reference>(
            from.readReferenceRows(fromId, role, layer, rows.begin, rows.end));
    }
    LayerSource source = alignReferenceSource(ref->k, ref->v, ref->batchRow, config, config.groups[std::size_t(group)],
                                              sequenceLength(promptId), from.path(),
                                              bundle_path::referenceKv(fromId, role, layer, "k"), ref->slab);
    source.storage.push_back(std::move(ref));
    return source;
}

}  // namespace kvscope
