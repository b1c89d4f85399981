#include "kv/reference_alignment.h"

#include "format/bundle_error.h"
#include "kv/reconstruction.h"

namespace kvscope {

LayerSource alignReferenceSource(const RawTensor& k, const RawTensor& v, std::int64_t batchRow,
                                 const KvCacheConfig& config, const KvCacheGroup& group, std::int64_t targetLen,
                                 const std::string& file, const std::string& object,
                                 const std::optional<ReferenceSlab>& slab)
{
    auto fail = [&](const std::string& problem) { throw BundleError(file, object, problem); };
    const char* kName = partLabel(group, KvPart::K);
    const char* vName = partLabel(group, KvPart::V);
    if (k.shape.size() != 4 || v.shape.size() != 4 || std::vector(k.shape.begin(), k.shape.end() - 1) != std::vector(v.shape.begin(), v.shape.end() - 1))
        fail(std::string(kName) + " " + shapeToString(k.shape) + " and " + vName + " " + shapeToString(v.shape) +
             " must share [batch, heads, seq] and each be [batch, heads, seq, head_dim]");
    const std::int64_t batch = slab ? slab->batch : k.shape[0], heads = k.shape[1], seq = slab ? slab->seq : k.shape[2];
    // Where the tensors' rows start: the whole reference, or one batch row's positions from firstRow.
    const std::int64_t tensorRow = slab ? 0 : batchRow, tensorSeq = k.shape[2], firstRow = slab ? slab->firstRow : 0;
    if (slab && (k.shape[0] != 1 || firstRow < 0 || firstRow + tensorSeq > seq))
        fail("holds positions " + std::to_string(firstRow) + ".." + std::to_string(firstRow + tensorSeq - 1) +
             " of a reference of " + std::to_string(seq));
    const HeadDims dims = headDimsOf(group);
    if (batchRow < 0 || batchRow >= batch)
        fail("batch row " + std::to_string(batchRow) + " outside a batch of " + std::to_string(batch));
    if (heads != group.totalKvHeads)
        fail(std::to_string(heads) + " heads, the config has total_num_kv_heads " + std::to_string(group.totalKvHeads) +
             (group.totalKvHeads != config.totalNumKvHeads ? " for this layer's group" : ""));
    for (KvPart part : {KvPart::K, KvPart::V}) {
        const std::int64_t dim = (part == KvPart::K ? k : v).shape[3];
        if (dim != dims.of(part))
            fail(std::string(partLabel(group, part)) + " is " + std::to_string(dim) + " wide, the config has " +
                 partWidthName(group, part) + " " + std::to_string(dims.of(part)));
    }

    std::int64_t offset = 0;  // engine position of the reference's first position
    if (seq != targetLen) {
        const bool windowTrimmed = group.slidingWindow && seq == *group.slidingWindow - 1 && seq < targetLen;
        // A chunked layer's cache may keep only its latest positions: they end the sequence, and
        // must reach back to the start of the last token's chunk (what the engine attends to).
        std::int64_t chunkNeeds = 0;
        if (group.attentionChunkSize) {
            const std::int64_t c = *group.attentionChunkSize, last = targetLen - 1;
            chunkNeeds = targetLen - last / c * c;
        }
        const bool chunkTrimmed = group.attentionChunkSize && seq < targetLen && seq >= chunkNeeds;
        if (!windowTrimmed && !chunkTrimmed)
            fail("sequence length " + std::to_string(seq) + " does not match the engine's " +
                 std::to_string(targetLen) +
                 (group.slidingWindow ? " nor the sliding window's " + std::to_string(*group.slidingWindow - 1)
                                      : std::string()) +
                 (group.attentionChunkSize ? ", nor covers the last chunk of " +
                                                 std::to_string(*group.attentionChunkSize) + " (its " +
                                                 std::to_string(chunkNeeds) + " positions)"
                                           : std::string()));
        offset = targetLen - seq;
    }

    LayerSource out = LayerSource::absent(int(heads), targetLen, dims, 1);
    for (std::int64_t s = firstRow; s < firstRow + tensorSeq; ++s) {  // [tensorRow, 0, s - firstRow, 0]
        const std::int64_t row = tensorRow * heads * tensorSeq + s - firstRow;
        out.runs(KvPart::K, offset + s)[0] = {&k, row * dims.k, tensorSeq * dims.k};
        out.runs(KvPart::V, offset + s)[0] = {&v, row * dims.v, tensorSeq * dims.v};
        out.present[std::size_t(offset + s)] = 1;
    }
    return out;
}

PositionRange referenceRowsFor(PositionRange window, std::int64_t seq, std::int64_t targetLen)
{
    const std::int64_t offset = targetLen - seq;  // engine position of the reference's first
    const PositionRange rows{window.begin - offset, window.end == PositionRange::all().end ? seq : window.end - offset};
    return rows.clippedTo({0, seq});
}

LayerKv alignReference(const RawTensor& k, const RawTensor& v, std::int64_t batchRow, const KvCacheConfig& config,
                       const KvCacheGroup& group, std::int64_t targetLen, const std::string& file,
                       const std::string& object)
{
    return alignReferenceSource(k, v, batchRow, config, group, targetLen, file, object).materialize();
}

}  // namespace kvscope
