#include "kv/reconstruction.h"

#include "format/bundle_error.h"

#include <algorithm>
#include <unordered_map>

namespace kvscope {

namespace {

struct ErrorContext {
    const ReconstructOptions& options;
    std::string layer;
    [[noreturn]] void fail(const std::string& problem) const
    {
        const std::string object = options.object.empty() ? "layer '" + layer + "'"
                                                           : options.object + ", layer '" + layer + "'";
        throw BundleError(options.file, object, problem);
    }
};

const KvCacheGroup& groupOfLayer(const KvCacheConfig& config, const std::string& layer, const ErrorContext& ctx)
{
    const int g = config.groupOf(layer);
    if (g < 0)
        ctx.fail("belongs to no KV cache group of the config");
    return config.groups[std::size_t(g)];
}

void checkShard(const KvCacheConfig& config, const KvCacheGroup& group, const std::vector<PagedShard>& shards,
                int rank, KvPart part, const ErrorContext& ctx)
{
    const std::string what = std::string(partLabel(group, part)) + " shard of TP rank " + std::to_string(rank);
    if (std::size_t(rank) >= shards.size() || shards[std::size_t(rank)].blocks.shape.empty())
        ctx.fail(what + " is missing" +
                 (config.dcpSize > 1 ? " (DCP rank " + std::to_string(config.dcpRankOf(rank)) + " of " +
                                           std::to_string(config.dcpSize) + ": without it every " +
                                           std::to_string(config.dcpSize) + "th run of " + std::to_string(config.cpInterleave) +
                                           " position(s) has no KV)"
                                     : std::string()));
    const PagedShard& shard = shards[std::size_t(rank)];
    const std::vector<std::int64_t> expected{std::int64_t(shard.physicalIds.size()), group.numKvHeads,
                                             group.blockSize, group.partWidth(part)};
    if (shard.blocks.shape != expected)
        ctx.fail(what + " has shape " + shapeToString(shard.blocks.shape) + ", the config implies " +
                 shapeToString(expected) + " ([stored blocks, heads_per_rank, block_size, " +
                 partWidthName(group, part) + "])");
    if (shard.blocks.dtype != group.partDType(part))
        ctx.fail(what + " is " + dtypeName(shard.blocks.dtype) + ", the config says " +
                 dtypeName(group.partDType(part)));
    if (group.dsMla && part == KvPart::K && shard.blocks.elementsPerScale != kDsMlaScaleGroup)
        ctx.fail(what + " is fp8_ds_mla, which has a scale per " + std::to_string(kDsMlaScaleGroup) +
                 " values ([stored blocks, 1, block_size, kv_lora_rank / " + std::to_string(kDsMlaScaleGroup) +
                 "] in k_scale); " +
                 (shard.blocks.scales.empty() ? std::string("it has none") : "it has one per " + std::to_string(shard.blocks.elementsPerScale)));
    if (ctx.options.values == ValueRead::Values &&
        shard.blocks.bytes.size() != std::size_t(shard.blocks.numel()) * dtypeSize(shard.blocks.dtype))
        ctx.fail(what + " holds " + std::to_string(shard.blocks.bytes.size()) + " bytes, its shape needs more");
}

std::unordered_map<std::int64_t, std::int64_t> slotsOf(const PagedShard& shard)
{
    std::unordered_map<std::int64_t, std::int64_t> slots;
    slots.reserve(shard.physicalIds.size());
    for (std::size_t i = 0; i < shard.physicalIds.size(); ++i)
        slots.emplace(shard.physicalIds[i], std::int64_t(i));
    return slots;
}

}  // namespace

std::int64_t firstHeldPosition(const KvCacheGroup& group, std::int64_t writtenLen)
{
    if (group.specType == SpecType::SlidingWindow && group.slidingWindow)
        return std::max<std::int64_t>(0, writtenLen - *group.slidingWindow + 1);
    if (group.specType == SpecType::ChunkedLocal && group.attentionChunkSize)  // the next token's chunk
        return writtenLen / *group.attentionChunkSize * *group.attentionChunkSize;
    return 0;
}

std::vector<std::int64_t> requiredBlocks(const KvCacheConfig& config, const std::string& layer,
                                         const BlockTable& table, std::int64_t row, std::int64_t writtenLen,
                                         PositionRange window)
{
    std::vector<std::int64_t> ids;
    const int g = config.groupOf(layer);
    if (g < 0 || row < 0 || row >= table.rows || writtenLen <= 0)
        return ids;
    const KvCacheGroup& group = config.groups[std::size_t(g)];
    const std::int64_t span = config.positionsPerEntry(group);
    const PositionRange wanted = PositionRange{firstHeldPosition(group, writtenLen), writtenLen}.clippedTo(window);
    if (wanted.empty())
        return ids;
    const std::int64_t first = wanted.begin / span;
    const std::int64_t last = std::min<std::int64_t>((wanted.end - 1) / span, table.cols - 1);
    for (std::int64_t b = first; b <= last; ++b) {
        const std::int32_t id = table.at(row, b);
        if (id >= 0 && id < config.numBlocks)
            ids.push_back(id);
    }
    std::sort(ids.begin(), ids.end());
    ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
    return ids;
}

namespace {

// reconstructSource without ownership: the runs point into `shards`.
LayerSource sourceOf(const KvCacheConfig& config, const std::string& layer, const LayerShards& shards,
                     const BlockTable& table, std::int64_t row, std::int64_t writtenLen,
                     const ReconstructOptions& options, std::vector<std::string>* problems, std::int64_t length,
                     PositionRange window)
{
    const ErrorContext ctx{options, layer};
    const KvCacheGroup& group = groupOfLayer(config, layer, ctx);
    const TpLayout layout = config.layout(group);
    const std::vector<int> ranks = layout.contributingRanks();
    for (int rank : layout.ranksRead()) {
        checkShard(config, group, shards.k, rank, KvPart::K, ctx);
        checkShard(config, group, shards.v, rank, KvPart::V, ctx);
    }
    if (row < 0 || row >= table.rows)
        ctx.fail("block-table row " + std::to_string(row) + " does not exist (table has " +
                 std::to_string(table.rows) + " rows)");
    if (writtenLen < 0)
        ctx.fail("negative sequence length " + std::to_string(writtenLen));

    const int headsPerRank = group.numKvHeads;
    const int heads = headsPerRank * int(ranks.size());
    const HeadDims dims = headDimsOf(group);
    const int blockSize = group.blockSize;
    const std::int64_t span = config.positionsPerEntry(group);
    const std::int64_t neededEntries = (writtenLen + span - 1) / span;
    if (neededEntries > table.cols)  // before allocating: the table bounds what can be real
        ctx.fail("block table of group " + std::to_string(config.groupOf(layer)) + " has " +
                 std::to_string(table.cols) + " entries per row, " + std::to_string(writtenLen) +
                 " positions need " + std::to_string(neededEntries));
    if (length < writtenLen)
        length = writtenLen;
    LayerSource out = LayerSource::absent(heads, length, dims, int(ranks.size()));
    if (writtenLen == 0)
        return out;

    // Per TP rank read: where each physical block sits in its shard.
    std::vector<std::unordered_map<std::int64_t, std::int64_t>> kSlots(shards.k.size()), vSlots(shards.v.size());
    for (int rank : layout.ranksRead()) {
        kSlots[std::size_t(rank)] = slotsOf(shards.k[std::size_t(rank)]);
        vSlots[std::size_t(rank)] = slotsOf(shards.v[std::size_t(rank)]);
    }

    const std::int64_t firstHeld = firstHeldPosition(group, writtenLen);
    const PositionRange wanted = PositionRange{firstHeld, writtenLen}.clippedTo(window);
    const int first = ranks.front();

    for (std::int64_t b = wanted.empty() ? neededEntries : wanted.begin / span; b < neededEntries && b * span < wanted.end; ++b) {
        const std::int64_t begin = std::max(b * span, firstHeld);
        const std::int64_t end = std::min((b + 1) * span, writtenLen);
        const std::int32_t id = table.at(row, b);
        std::string problem;
        if (id == -1)
            problem = "is the null block (-1)";
        else if (id < 0 || id >= config.numBlocks)
            problem = "is physical block " + std::to_string(id) + ", outside [0, num_blocks=" +
                      std::to_string(config.numBlocks) + ")";
        else if (!kSlots[std::size_t(first)].count(id) || !vSlots[std::size_t(first)].count(id))
            problem = "is physical block " + std::to_string(id) + ", which the bundle does not store";
        if (!problem.empty()) {
            const std::string message = "row " + std::to_string(row) + ", logical block " + std::to_string(b) +
                                        " (positions " + std::to_string(begin) + ".." + std::to_string(end - 1) +
                                        ") " + problem + " but its data is needed";
            if (options.unreadableBlocks == UnreadableBlockPolicy::Error)
                ctx.fail(message);
            if (problems)
                problems->push_back(options.file + ": " + options.object + ", layer '" + layer + "': " + message);
            continue;
        }
        const PositionRange filled = PositionRange{begin, end}.clippedTo(wanted);
        for (std::int64_t pos = filled.begin; pos < filled.end; ++pos) {
            const TokenSlot slot = config.slotOf(group, pos);
            for (std::size_t i = 0; i < ranks.size(); ++i) {
                const int rank = ranks[i] + slot.dcpRank;  // the DCP group member holding the position
                const auto kSlot = kSlots[std::size_t(rank)].find(id);
                const auto vSlot = vSlots[std::size_t(rank)].find(id);
                if (kSlot == kSlots[std::size_t(rank)].end() || vSlot == vSlots[std::size_t(rank)].end())
                    ctx.fail("physical block " + std::to_string(id) + " is missing from TP rank " + std::to_string(rank) +
                             "'s shard" + (config.dcpSize > 1 ? " (DCP rank " + std::to_string(slot.dcpRank) +
                                                                    ", which holds position " + std::to_string(pos) + ")"
                                                              : std::string()));
                // The rank's heads of a position: blocks[slot, h, offset, :].
                out.runs(KvPart::K, pos)[i] = {&shards.k[std::size_t(rank)].blocks,
                                               (kSlot->second * headsPerRank * blockSize + slot.offset) * dims.k,
                                               std::int64_t(blockSize) * dims.k};
                out.runs(KvPart::V, pos)[i] = {&shards.v[std::size_t(rank)].blocks,
                                               (vSlot->second * headsPerRank * blockSize + slot.offset) * dims.v,
                                               std::int64_t(blockSize) * dims.v};
            }
        }
        std::fill(out.present.begin() + filled.begin, out.present.begin() + filled.end, 1);
    }
    return out;
}

}  // namespace

LayerSource reconstructSource(const KvCacheConfig& config, const std::string& layer,
                              std::shared_ptr<const LayerShards> shards, const BlockTable& table, std::int64_t row,
                              std::int64_t writtenLen, const ReconstructOptions& options,
                              std::vector<std::string>* problems, std::int64_t length, PositionRange window)
{
    LayerSource source = sourceOf(config, layer, *shards, table, row, writtenLen, options, problems, length, window);
    source.storage.push_back(std::move(shards));
    return source;
}

LayerKv reconstructLayer(const KvCacheConfig& config, const std::string& layer, const LayerShards& shards,
                         const BlockTable& table, std::int64_t row, std::int64_t writtenLen,
                         const ReconstructOptions& options, std::vector<std::string>* problems, std::int64_t length,
                         PositionRange window)
{
    return sourceOf(config, layer, shards, table, row, writtenLen, options, problems, length, window).materialize();
}

}  // namespace kvscope
