#include "kv/reference_alignment.h"

#include "format/bundle_error.h"

namespace kvscope {

LayerSource alignReferenceSource(const RawTensor& k, const RawTensor& v, std::int64_t batchRow,
                                 const KvCacheConfig& config, const KvCacheGroup& group, std::int64_t targetLen,
                                 const std::string& file, const std::string& object)
{
    auto fail = [&](const std::string& problem) { throw BundleError(file, object, problem); };
    if (k.shape.size() != 4 || k.shape != v.shape)
        fail("k " + shapeToString(k.shape) + " and v " + shapeToString(v.shape) +
             " must share one shape [batch, heads, seq, head_dim]");
    const std::int64_t batch = k.shape[0], heads = k.shape[1], seq = k.shape[2], dim = k.shape[3];
    if (batchRow < 0 || batchRow >= batch)
        fail("batch row " + std::to_string(batchRow) + " outside a batch of " + std::to_string(batch));
    if (heads != config.totalNumKvHeads)
        fail(std::to_string(heads) + " heads, the config has total_num_kv_heads " +
             std::to_string(config.totalNumKvHeads));
    if (dim != group.headSize)
        fail("head_dim " + std::to_string(dim) + ", the config has head_size " + std::to_string(group.headSize));

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

    LayerSource out = LayerSource::absent(int(heads), targetLen, int(dim), 1);
    for (std::int64_t s = 0; s < seq; ++s) {
        const std::int64_t first = (batchRow * heads * seq + s) * dim;  // [batchRow, 0, s, 0]
        out.runs(KvPart::K, offset + s)[0] = {&k, first, seq * dim};
        out.runs(KvPart::V, offset + s)[0] = {&v, first, seq * dim};
        out.present[std::size_t(offset + s)] = 1;
    }
    return out;
}

LayerKv alignReference(const RawTensor& k, const RawTensor& v, std::int64_t batchRow, const KvCacheConfig& config,
                       const KvCacheGroup& group, std::int64_t targetLen, const std::string& file,
                       const std::string& object)
{
    return alignReferenceSource(k, v, batchRow, config, group, targetLen, file, object).materialize();
}

}  // namespace kvscope
