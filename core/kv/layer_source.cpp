#include "kv/layer_source.h"

#include "util/content_hash.h"

#include <cstring>

namespace kvscope {

LayerSource LayerSource::absent(int heads, std::int64_t seq, HeadDims dims, int runsPerRow)
{
    LayerSource s;
    s.heads = heads;
    s.seq = seq;
    s.dims = dims;
    s.runsPerRow = runsPerRow;
    s.k = std::make_unique_for_overwrite<HeadRun[]>(std::size_t(seq) * std::size_t(runsPerRow));
    s.v = std::make_unique_for_overwrite<HeadRun[]>(std::size_t(seq) * std::size_t(runsPerRow));
    s.present.assign(std::size_t(seq), 0);
    return s;
}

namespace {

// Calls span(r, h, pos, count, tensor, first) for every piece of head h of run r whose
// positions [pos, pos + count) in [begin, end) are present and follow each other in `tensor`
// from element `first` on (a reference's head: all of them; an engine block: its positions).
template <typename Span>
void forEachSpan(const LayerSource& source, KvPart part, std::int64_t begin, std::int64_t end, Span&& span)
{
    const HeadRun* all = (part == KvPart::K ? source.k : source.v).get();
    const int runsPerRow = source.runsPerRow;
    const int headsPerRun = source.heads / runsPerRow;
    const std::int64_t headDim = source.headDim(part);
    auto runAt = [&](std::int64_t pos, int r) -> const HeadRun& {
        return all[std::size_t(pos) * std::size_t(runsPerRow) + std::size_t(r)];
    };
    for (int r = 0; r < runsPerRow; ++r)
        for (int h = 0; h < headsPerRun; ++h)
            for (std::int64_t pos = begin; pos < end;) {
                if (!source.present[std::size_t(pos)]) {
                    ++pos;
                    continue;
                }
                const HeadRun& run = runAt(pos, r);
                const std::int64_t first = run.offset + h * run.headStride;
                std::int64_t next = pos + 1;
                while (next < end && source.present[std::size_t(next)] && runAt(next, r).tensor == run.tensor &&
                       runAt(next, r).offset + h * runAt(next, r).headStride == first + (next - pos) * headDim)
                    ++next;
                span(r, h, pos, next - pos, *run.tensor, first);
                pos = next;
            }
}

}  // namespace

void LayerSource::decodeHeads(KvPart part, std::int64_t begin, std::int64_t end, float* out) const
{
    const int headsPerRun = heads / runsPerRow;
    const std::int64_t dim = headDim(part);
    forEachSpan(*this, part, begin, end,
                [&](int r, int h, std::int64_t pos, std::int64_t count, const RawTensor& tensor, std::int64_t first) {
                    float* headOut = out + std::size_t(r * headsPerRun + h) * std::size_t((end - begin) * dim);
                    tensor.decode(first, count * dim, headOut + std::size_t((pos - begin) * dim));
                });
}

void LayerSource::prefetchHeads(KvPart part, std::int64_t begin, std::int64_t end) const
{
    constexpr std::size_t kLine = 64;
    const std::size_t dim = std::size_t(headDim(part));
    forEachSpan(*this, part, begin, end,
                [&](int, int, std::int64_t, std::int64_t count, const RawTensor& tensor, std::int64_t first) {
                    const std::size_t size = dtypeSize(tensor.dtype);
                    const auto* at = tensor.bytes.data() + std::size_t(first) * size;
                    const std::size_t bytes = std::size_t(count) * dim * size;
                    for (std::size_t line = 0; line < bytes; line += kLine)
                        __builtin_prefetch(at + line);
                });
}

RowView LayerSource::storedFloatRow(KvPart part, std::int64_t pos) const
{
    if (runsPerRow != 1)
        return {};
    const HeadRun& run = *runs(part, pos);
    if (run.tensor->dtype != DType::Float32 || run.tensor->scale != 1.0f || !run.tensor->scales.empty())
        return {};
    return {reinterpret_cast<const float*>(run.tensor->bytes.data()) + run.offset, std::size_t(run.headStride)};
}

LayerSource::Storage LayerSource::storedAs(KvPart part, std::int64_t pos, int head) const
{
    const int perRun = heads / runsPerRow;
    const HeadRun& run = runs(part, pos)[head / perRun];
    const std::int64_t first = run.offset + std::int64_t(head % perRun) * run.headStride;
    return {run.tensor->dtype, run.tensor->scaleAt(first), run.tensor->granularity(), run.tensor, first};
}

ContentHash LayerSource::startHash() const
{
    ContentHash hash;
    hash.add(std::uint64_t(heads) << 32 | std::uint64_t(dims.k));
    hash.add(std::uint64_t(seq) << 32 | std::uint64_t(dims.v));
    return hash;
}

void LayerSource::addToHash(ContentHash& hash, PositionRange window) const
{
    // Position after position, each head's row with its dtype and scale: the same bytes in the
    // same order whatever windows the positions are read in.
    const int headsPerRun = heads / runsPerRow;
    const PositionRange range = window.clippedTo({0, seq});
    for (std::int64_t pos = range.begin; pos < range.end; ++pos) {
        if (!present[std::size_t(pos)])
            continue;
        hash.add(std::uint64_t(pos));
        for (KvPart part : {KvPart::K, KvPart::V}) {
            const std::size_t dim = std::size_t(headDim(part));
            const HeadRun* run = runs(part, pos);
            for (int r = 0; r < runsPerRow; ++r)
                for (int h = 0; h < headsPerRun; ++h) {
                    const RawTensor& tensor = *run[r].tensor;
                    const std::int64_t first = run[r].offset + h * run[r].headStride;
                    const std::size_t size = dtypeSize(tensor.dtype);
                    const float scale = tensor.scaleAt(first);
                    std::uint32_t scaleBits;
                    std::memcpy(&scaleBits, &scale, 4);
                    hash.add(std::uint64_t(tensor.dtype) << 32 | scaleBits);
                    if (tensor.dtype == DType::Int4TokenHead)
                        hash.add(std::uint64_t(tensor.zeroPointAt(first)));
                    if (tensor.dtype == DType::Float4E2M1 && tensor.elementsPerScale > 0)  // every block's scale
                        for (std::size_t i = std::size_t(tensor.elementsPerScale); i < dim; i += std::size_t(tensor.elementsPerScale)) {
                            const float block = tensor.scaleAt(first + std::int64_t(i));
                            std::memcpy(&scaleBits, &block, 4);
                            hash.add(std::uint64_t(scaleBits));
                        }
                    hash.add(tensor.bytes.data() + std::size_t(first) * size, dim * size);
                }
        }
    }
}

std::uint64_t LayerSource::contentHash() const
{
    ContentHash hash = startHash();
    addToHash(hash, PositionRange::all());
    return hash.value();
}

LayerKv LayerSource::materialize() const
{
    LayerKv out = LayerKv::unwritten(heads, seq, dims);
    for (std::int64_t pos = 0; pos < seq; ++pos) {
        if (!present[std::size_t(pos)])
            continue;
        // One position head-major is its row.
        for (KvPart part : {KvPart::K, KvPart::V})
            decodeHeads(part, pos, pos + 1, out.values(part).data() + out.index(part, 0, pos));
        out.present[std::size_t(pos)] = 1;
    }
    out.clearAbsent();
    return out;
}

}  // namespace kvscope
