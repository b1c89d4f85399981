#include "kv/layer_source.h"

namespace kvscope {

LayerSource LayerSource::absent(int heads, std::int64_t seq, int headDim, int runsPerRow)
{
    LayerSource s;
    s.heads = heads;
    s.seq = seq;
    s.headDim = headDim;
    s.runsPerRow = runsPerRow;
    s.k.resize(std::size_t(seq) * std::size_t(runsPerRow));
    s.v.resize(s.k.size());
    s.present.assign(std::size_t(seq), 0);
    return s;
}

void LayerSource::decodeHeads(KvPart part, std::int64_t begin, std::int64_t end, float* out) const
{
    const std::vector<HeadRun>& all = part == KvPart::K ? k : v;
    const int headsPerRun = heads / runsPerRow;
    const std::size_t dim = std::size_t(headDim);
    auto start = [&](std::int64_t pos, int r, int h) {
        const HeadRun& run = all[std::size_t(pos) * std::size_t(runsPerRow) + std::size_t(r)];
        return run.offset + h * run.headStride;
    };
    for (int r = 0; r < runsPerRow; ++r)
        for (int h = 0; h < headsPerRun; ++h) {
            float* headOut = out + std::size_t(r * headsPerRun + h) * std::size_t(end - begin) * dim;
            for (std::int64_t pos = begin; pos < end;) {
                if (!present[std::size_t(pos)]) {
                    ++pos;
                    continue;
                }
                const RawTensor* tensor = all[std::size_t(pos) * std::size_t(runsPerRow) + std::size_t(r)].tensor;
                const std::int64_t first = start(pos, r, h);
                std::int64_t next = pos + 1;
                while (next < end && present[std::size_t(next)] &&
                       all[std::size_t(next) * std::size_t(runsPerRow) + std::size_t(r)].tensor == tensor &&
                       start(next, r, h) == first + (next - pos) * headDim)
                    ++next;
                tensor->decode(first, (next - pos) * headDim, headOut + std::size_t(pos - begin) * dim);
                pos = next;
            }
        }
}

void LayerSource::prefetchHeads(KvPart part, std::int64_t begin, std::int64_t end) const
{
    const std::vector<HeadRun>& all = part == KvPart::K ? k : v;
    const int headsPerRun = heads / runsPerRow;
    constexpr std::size_t kLine = 64;
    for (std::int64_t pos = begin; pos < end; ++pos) {
        if (!present[std::size_t(pos)])
            continue;
        for (int r = 0; r < runsPerRow; ++r) {
            const HeadRun& run = all[std::size_t(pos) * std::size_t(runsPerRow) + std::size_t(r)];
            const std::size_t size = dtypeSize(run.tensor->dtype);
            const std::size_t bytes = std::size_t(headDim) * size;
            for (int h = 0; h < headsPerRun; ++h) {
                const auto* at = run.tensor->bytes.data() + std::size_t(run.offset + h * run.headStride) * size;
                for (std::size_t line = 0; line < bytes; line += kLine)
                    __builtin_prefetch(at + line);
            }
        }
    }
}

RowView LayerSource::storedFloatRow(KvPart part, std::int64_t pos) const
{
    if (runsPerRow != 1)
        return {};
    const HeadRun& run = *runs(part, pos);
    if (run.tensor->dtype != DType::Float32 || run.tensor->scale != 1.0f)
        return {};
    return {reinterpret_cast<const float*>(run.tensor->bytes.data()) + run.offset, std::size_t(run.headStride)};
}

LayerKv LayerSource::materialize() const
{
    LayerKv out = LayerKv::unwritten(heads, seq, headDim);
    for (std::int64_t pos = 0; pos < seq; ++pos) {
        if (!present[std::size_t(pos)])
            continue;
        // One position head-major is its row.
        decodeHeads(KvPart::K, pos, pos + 1, out.k.data() + out.index(0, pos));
        decodeHeads(KvPart::V, pos, pos + 1, out.v.data() + out.index(0, pos));
        out.present[std::size_t(pos)] = 1;
    }
    out.clearAbsent();
    return out;
}

}  // namespace kvscope
