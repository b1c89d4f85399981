#include "transfer/layer_blocks.h"

#include "format/bundle_error.h"
#include "kv/capture_loader.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>

namespace kvscope {

bool LayerBlocks::present(std::int64_t pos) const
{
    if (pos < 0 || pos >= written)
        return false;
    const std::int64_t e = entryOf(pos);
    return e < entries() && stored[std::size_t(e)];
}

LayerBlocks readLayerBlocks(const CaptureLoader& loader, const std::string& promptId, std::size_t snapshot,
                            const std::string& layer, std::vector<std::string>* problems)
{
    const KvCacheConfig& config = loader.config();
    const int groupIndex = config.groupOf(layer);
    if (groupIndex < 0)
        throw BundleError(loader.path(), "layer '" + layer + "'", "belongs to no group of the config");
    const KvCacheGroup& group = config.groups[std::size_t(groupIndex)];
    const SnapshotInfo& snap = loader.prompt(promptId).snapshots.at(snapshot);
    const BlockTable table = loader.blockTable(promptId, snapshot, std::size_t(groupIndex));

    LayerBlocks blocks;
    blocks.heads = group.totalKvHeads;
    blocks.blockSize = group.blockSize;
    blocks.dims = HeadDims(group.partWidth(KvPart::K), group.partWidth(KvPart::V));
    blocks.written = std::max<std::int64_t>(0, snap.seqLen() - 1);  // the last token is never written
    const std::int64_t entries =
        std::min<std::int64_t>(table.cols, (blocks.written + group.blockSize - 1) / group.blockSize);
    blocks.written = std::min(blocks.written, entries * group.blockSize);
    blocks.physical.resize(std::size_t(entries));
    blocks.stored.assign(std::size_t(entries), 0);
    std::vector<std::int64_t> ids;
    for (std::int64_t e = 0; e < entries; ++e) {
        blocks.physical[std::size_t(e)] = table.at(snap.batchRow, e);
        if (blocks.physical[std::size_t(e)] >= 0)
            ids.push_back(blocks.physical[std::size_t(e)]);
    }
    std::sort(ids.begin(), ids.end());
    ids.erase(std::unique(ids.begin(), ids.end()), ids.end());

    const TpLayout layout = config.layout(group);
    const int perRank = layout.headsPerRank();
    const std::size_t rows = std::size_t(entries) * std::size_t(blocks.heads) * std::size_t(blocks.blockSize);
    std::vector<std::uint8_t> found(std::size_t(entries), 1);
    for (KvPart part : {KvPart::K, KvPart::V}) {
        const std::size_t p = std::size_t(part);
        const std::size_t dim = std::size_t(blocks.dims.of(part));
        blocks.values[p].assign(rows * dim, std::numeric_limits<float>::quiet_NaN());
        blocks.rowScales[p].assign(rows, 1.0f);
        for (int rank : layout.contributingRanks()) {
            const PagedShard shard = loader.engineShard(promptId, snapshot, rank, layer, part, ids);
            std::map<std::int64_t, std::size_t> rowOf;
            for (std::size_t r = 0; r < shard.physicalIds.size(); ++r)
                rowOf.emplace(shard.physicalIds[r], r);
            const std::size_t blockValues = std::size_t(perRank) * std::size_t(blocks.blockSize) * dim;
            std::vector<float> decoded(blockValues);
            for (std::int64_t e = 0; e < entries; ++e) {
                const auto at = rowOf.find(blocks.physical[std::size_t(e)]);
                if (at == rowOf.end()) {
                    found[std::size_t(e)] = 0;
                    continue;
                }
                const std::int64_t offset = std::int64_t(at->second * blockValues);
                shard.blocks.decode(offset, std::int64_t(blockValues), decoded.data());
                for (int j = 0; j < perRank; ++j) {
                    const int head = layout.headOnRank(rank, j);
                    for (int r = 0; r < blocks.blockSize; ++r) {
                        const std::size_t from = (std::size_t(j) * std::size_t(blocks.blockSize) + std::size_t(r)) * dim;
                        std::copy_n(decoded.data() + from, dim,
                                    blocks.values[p].data() + blocks.rowIndex(e, head, r) * dim);
                        float scale = 0;
                        for (std::size_t d = 0; d < dim; ++d)
                            scale = std::max(scale, shard.blocks.dequantScaleAt(offset + std::int64_t(from + d)));
                        blocks.rowScales[p][blocks.rowIndex(e, head, r)] = scale;
                    }
                }
            }
        }
    }
    for (std::int64_t e = 0; e < entries; ++e) {
        blocks.stored[std::size_t(e)] = blocks.physical[std::size_t(e)] >= 0 && found[std::size_t(e)];
        if (problems && blocks.physical[std::size_t(e)] >= 0 && !found[std::size_t(e)])
            problems->push_back(BundleError(loader.path(), bundle_path::snapshot(promptId, snapshot) + " (" + layer + ")",
                                            "block " + std::to_string(blocks.physical[std::size_t(e)]) +
                                                " of the block table is not stored: positions " +
                                                std::to_string(e * blocks.blockSize) + "-" +
                                                std::to_string((e + 1) * blocks.blockSize - 1) + " left out")
                                    .what());
    }
    return blocks;
}

}  // namespace kvscope
