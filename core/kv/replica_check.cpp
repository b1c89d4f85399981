#include "kv/replica_check.h"

#include "kv/capture_loader.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <map>
#include <unordered_map>

namespace kvscope {

std::string ReplicaDifference::describe() const
{
    std::string text = "TP rank " + std::to_string(rank) + "'s copy of " + part + " of " + layer + " differs from rank " +
                       std::to_string(againstRank) + "'s from physical block " + std::to_string(physicalBlock) +
                       " (logical " + std::to_string(logicalBlock) + ", positions " + std::to_string(firstPosition) + "-" +
                       std::to_string(lastPosition) + "; " + std::to_string(blocks) + " block(s) differ, snapshot " +
                       std::to_string(snapshot) + ")";
    const std::string wrong = wrongHeadText();
    if (!wrong.empty())
        text += "; " + wrong + ": its copy is rank " + std::to_string(holdsFrom) + "'s bit for bit";
    return text;
}

std::string ReplicaDifference::wrongHeadText() const
{
    if (head < 0 || (copyHoldsHead < 0 && readHoldsHead < 0))
        return {};
    const bool copyWrong = copyHoldsHead >= 0;
    const int wrong = copyWrong ? rank : againstRank, right = copyWrong ? againstRank : rank;
    return "TP rank " + std::to_string(wrong) + " holds KV head " + std::to_string(copyWrong ? copyHoldsHead : readHoldsHead) +
           ", should hold head " + std::to_string(head) + " (its replica on rank " + std::to_string(right) + " does)";
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
        // The written positions of table entry b that DCP rank `dcpRank` holds, and their slots
        // (consecutive positions of one rank have consecutive slots); first < 0: none.
        struct EntrySlots {
            std::int32_t id = -1;
            std::int64_t first = -1, last = -1;
            int from = 0, to = 0;
        };
        int dcpRank = 0;
        const auto slotsOf = [&](std::int64_t b) {
            EntrySlots e;
            e.id = table.at(snap.batchRow, b);
            if (e.id < 0 || e.id >= config.numBlocks)
                return EntrySlots{};
            for (std::int64_t pos = std::max(b * span, firstHeld); pos < std::min((b + 1) * span, written); ++pos) {
                const TokenSlot slot = config.slotOf(group, pos);
                if (slot.dcpRank != dcpRank)
                    continue;
                if (e.first < 0)
                    e.first = pos, e.from = slot.offset;
                e.last = pos, e.to = slot.offset + 1;
            }
            return e;
        };
        // Whether two ranks' copies agree in every written slot of the window's blocks.
        std::map<int, std::array<PagedShard, 2>> shards;
        const auto shardOf = [&](int rank) -> const std::array<PagedShard, 2>& {
            auto it = shards.find(rank);
            if (it == shards.end()) {
                std::array<PagedShard, 2> x;
                for (KvPart part : {KvPart::K, KvPart::V})
                    x[std::size_t(part)] = loader.engineShard(promptId, s, rank, layer, part, ids);
                it = shards.emplace(rank, std::move(x)).first;
            }
            return it->second;
        };
        const auto agree = [&](int a, int b) {
            int compared = 0;
            for (std::int64_t entry = firstEntry; entry < endEntry; ++entry) {
                const EntrySlots e = slotsOf(entry);
                if (e.first < 0)
                    continue;
                ++compared;
                for (KvPart part : {KvPart::K, KvPart::V})
                    if (blockDiffers(shardOf(a)[std::size_t(part)], shardOf(b)[std::size_t(part)], e.id, e.from, e.to))
                        return false;
            }
            return compared > 0;
        };
        // The head whose copy `rank` holds instead of its own, and the rank of that copy: the
        // copy read of another head, trusted only where one of its replicas agrees with it (two
        // ranks exchanged leave no head with a copy to trust: nothing is named).
        const auto otherHeadIn = [&](int rank, int own) -> std::pair<int, int> {
            for (int h = 0; h < layout.totalHeads; ++h) {
                const std::vector<int> holders = layout.ranksHolding(h, dcpRank);
                if (h == own || holders.size() < 2 || !agree(rank, holders.front()))
                    continue;
                for (std::size_t i = 1; i < holders.size(); ++i)
                    if (holders[i] != rank && agree(holders.front(), holders[i]))
                        return {h, holders.front()};
            }
            return {-1, -1};
        };
        for (int reads : layout.ranksRead()) {
            dcpRank = config.dcpRankOf(reads);
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
                    const EntrySlots e = slotsOf(b);
                    if (e.first < 0)
                        continue;
                    const std::int32_t id = e.id, from = e.from, to = e.to;
                    const std::int64_t first = e.first, last = e.last;
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
                if (d.blocks > 0 && layout.mode() == TpMode::Replicated && layout.totalHeads > 1) {
                    d.head = layout.headOnRank(reads, 0);
                    if (const auto [h, from] = otherHeadIn(rank, d.head); h >= 0)
                        d.copyHoldsHead = h, d.holdsFrom = from;
                    else if (const auto [h2, from2] = otherHeadIn(reads, d.head); h2 >= 0)
                        d.readHoldsHead = h2, d.holdsFrom = from2;
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
        if (same == found.end()) {
            found.push_back(d);
            continue;
        }
        same->blocks += d.blocks;
        if (same->copyHoldsHead != d.copyHoldsHead || same->readHoldsHead != d.readHoldsHead || same->holdsFrom != d.holdsFrom)
            same->copyHoldsHead = same->readHoldsHead = same->holdsFrom = -1;
    }
}

}  // namespace kvscope
