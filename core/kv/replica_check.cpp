#include "kv/replica_check.h"

#include "kv/capture_loader.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <unordered_map>

namespace kvscope {

std::string ReplicaDifference::describe() const
{
    return "TP rank " + std::to_string(rank) + "'s copy of " + part + " of " + layer + " differs from rank " +
           std::to_string(againstRank) + "'s from physical block " + std::to_string(physicalBlock) + " (logical " +
           std::to_string(logicalBlock) + ", positions " + std::to_string(firstPosition) + "-" +
           std::to_string(lastPosition) + "; " + std::to_string(blocks) + " block(s) differ, snapshot " +
           std::to_string(snapshot) + ")";
}

namespace {

// Whether the copies of physical block `id` differ in the slots [from, to) the sequence wrote:
// their bytes, or the scales that go with them. (Slots past the last written position hold
// whatever each rank's memory held.)
bool blockDiffers(const PagedShard& a, const PagedShard& b, std::int64_t id, std::int64_t from, std::int64_t to)
{
    const auto slot = [](const PagedShard& s, std::int64_t block) {
        return std::size_t(std::find(s.physicalIds.begin(), s.physicalIds.end(), block) - s.physicalIds.begin());
    };
    const std::size_t i = slot(a, id), j = slot(b, id);
    if (i == a.physicalIds.size() || j == b.physicalIds.size())
        return false;  // not stored: reconstruction reports it
    if (a.blocks.dtype != b.blocks.dtype || a.blocks.shape[1] != b.blocks.shape[1] || a.blocks.shape[3] != b.blocks.shape[3])
        return true;  // stored otherwise: not the same bytes
    // [blocks, heads, block_size, width]: each head's run of the written slots.
    const std::int64_t heads = a.blocks.shape[1], blockSize = a.blocks.shape[2], width = a.blocks.shape[3];
    const std::size_t size = dtypeSize(a.blocks.dtype);
    for (std::int64_t h = 0; h < heads; ++h) {
        const auto at = [&](std::size_t row) { return ((std::int64_t(row) * heads + h) * blockSize + from) * width; };
        if (std::memcmp(a.blocks.bytes.data() + std::size_t(at(i)) * size, b.blocks.bytes.data() + std::size_t(at(j)) * size,
                        std::size_t((to - from) * width) * size) != 0)
            return true;
    }
    if (a.blocks.scale != b.blocks.scale || a.blocks.scales.size() != b.blocks.scales.size() ||
        a.blocks.zeroPoints.size() != b.blocks.zeroPoints.size() || a.blocks.rhtSigns != b.blocks.rhtSigns)
        return true;
    if (!a.blocks.zeroPoints.empty())  // int4: a zero point per slot, as its scale
        for (std::int64_t h = 0; h < heads; ++h) {
            const auto at = [&](std::size_t row) { return (std::int64_t(row) * heads + h) * blockSize + from; };
            if (!std::equal(a.blocks.zeroPoints.begin() + at(i), a.blocks.zeroPoints.begin() + at(i) + (to - from),
                            b.blocks.zeroPoints.begin() + at(j)))
                return true;
        }
    const ScaleGranularity g = a.blocks.granularity();
    if (g == ScaleGranularity::TokenHead || g == ScaleGranularity::TokenGroup) {  // per-slot scales
        const std::int64_t perSlot = std::int64_t(a.blocks.scales.size() / a.physicalIds.size()) / (heads * blockSize);
        for (std::int64_t h = 0; h < heads; ++h) {
            const auto at = [&](std::size_t row) { return ((std::int64_t(row) * heads + h) * blockSize + from) * perSlot; };
            if (!std::equal(a.blocks.scales.begin() + at(i), a.blocks.scales.begin() + at(i) + (to - from) * perSlot,
                            b.blocks.scales.begin() + at(j)))
                return true;
        }
        return false;
    }
    return a.blocks.scales != b.blocks.scales;
}

}  // namespace

std::vector<ReplicaDifference> findReplicaDifferences(const CaptureLoader& loader, const std::string& promptId,
                                                      const std::string& layer, PositionRange window)
{
    const KvCacheConfig& config = loader.config();
    std::vector<ReplicaDifference> found;
    const int g = config.groupOf(layer);
    if (g < 0 || !config.isCompared(layer) || config.layoutOf(layer).mode() != TpMode::Replicated)
        return found;
    const KvCacheGroup& group = config.groups[std::size_t(g)];
    const TpLayout layout = config.layout(group);
    const PromptInfo& prompt = loader.prompt(promptId);
    for (std::size_t s = 0; s < prompt.snapshots.size(); ++s) {
        const SnapshotInfo& snap = prompt.snapshots[s];
        const BlockTable table = loader.blockTable(promptId, s, std::size_t(g));
        const std::int64_t written = snap.seqLen() - 1;
        const std::int64_t firstHeld = firstHeldPosition(group, written);
        const std::int64_t span = config.positionsPerEntry(group);
        // The table entries whose first held position lies in the window, and their blocks.
        auto entryStart = [&](std::int64_t b) { return std::max(b * span, firstHeld); };
        auto inWindow = [&](std::int64_t b) { return window.contains(entryStart(b)); };
        std::int64_t firstEntry = firstHeld / span;
        while (firstEntry * span < written && entryStart(firstEntry) < window.begin)
            ++firstEntry;
        std::int64_t endEntry = firstEntry;  // exclusive
        while (endEntry * span < written && endEntry < table.cols && inWindow(endEntry))
            ++endEntry;
        if (endEntry == firstEntry)
            continue;
        const std::vector<std::int64_t> ids = requiredBlocks(config, layer, table, snap.batchRow, written,
                                                             {entryStart(firstEntry), std::min(written, endEntry * span)});
        if (ids.empty())
            continue;
        for (int reads : layout.ranksRead()) {
            const int dcpRank = config.dcpRankOf(reads);
            std::array<PagedShard, 2> read;
            for (KvPart part : {KvPart::K, KvPart::V})
                read[std::size_t(part)] = loader.engineShard(promptId, s, reads, layer, part, ids);
            // Its copies: the other ranks holding its heads and the same DCP rank's positions.
            for (int rank : layout.ranksHolding(layout.headOnRank(reads, 0), dcpRank)) {
                if (rank == reads)
                    continue;
                std::array<PagedShard, 2> copy;
                for (KvPart part : {KvPart::K, KvPart::V})
                    copy[std::size_t(part)] = loader.engineShard(promptId, s, rank, layer, part, ids);
                ReplicaDifference d{layer, s, rank, reads, {}, -1, -1, 0, 0, 0};
                for (std::int64_t b = firstEntry; b < endEntry; ++b) {
                    const std::int32_t id = table.at(snap.batchRow, b);
                    if (id < 0 || id >= config.numBlocks)
                        continue;
                    // The written positions of this entry that this DCP rank holds, and their slots
                    // (consecutive positions of one rank have consecutive slots).
                    std::int64_t first = -1, last = -1;
                    int from = 0, to = 0;
                    for (std::int64_t pos = std::max(b * span, firstHeld); pos < std::min((b + 1) * span, written); ++pos) {
                        const TokenSlot slot = config.slotOf(group, pos);
                        if (slot.dcpRank != dcpRank)
                            continue;
                        if (first < 0)
                            first = pos, from = slot.offset;
                        last = pos, to = slot.offset + 1;
                    }
                    if (first < 0)
                        continue;
                    for (KvPart part : {KvPart::K, KvPart::V}) {
                        if (!blockDiffers(read[std::size_t(part)], copy[std::size_t(part)], id, from, to))
                            continue;
                        if (d.blocks++ == 0) {
                            d.part = partLabel(group, part);
                            d.physicalBlock = id;
                            d.logicalBlock = b;
                            d.firstPosition = first;
                            d.lastPosition = last;
                        }
                        break;
                    }
                }
                if (d.blocks > 0)
                    found.push_back(d);
            }
        }
    }
    return found;
}

void mergeReplicaDifferences(std::vector<ReplicaDifference>& found, const std::vector<ReplicaDifference>& later)
{
    for (const ReplicaDifference& d : later) {
        const auto same = std::find_if(found.begin(), found.end(), [&](const ReplicaDifference& f) {
            return f.layer == d.layer && f.snapshot == d.snapshot && f.rank == d.rank && f.againstRank == d.againstRank;
        });
        if (same == found.end())
            found.push_back(d);
        else
            same->blocks += d.blocks;
    }
}

}  // namespace kvscope
