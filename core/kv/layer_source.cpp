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

void LayerSource::decodeRows(KvPart part, std::int64_t begin, std::int64_t end, float* out) const
{
    const std::vector<HeadRun>& all = part == KvPart::K ? k : v;
    const int headsPerRun = heads / runsPerRow;
    for (int r = 0; r < runsPerRow; ++r)
        for (int h = 0; h < headsPerRun; ++h)
            for (std::int64_t pos = begin; pos < end; ++pos) {
                if (!present[std::size_t(pos)])
                    continue;
                const HeadRun& run = all[std::size_t(pos) * std::size_t(runsPerRow) + std::size_t(r)];
                float* row = out + std::size_t(pos - begin) * rowSize();
                run.tensor->decode(run.offset + h * run.headStride, headDim,
                                   row + std::size_t(r * headsPerRun + h) * std::size_t(headDim));
            }
}

LayerKv LayerSource::materialize() const
{
    LayerKv out = LayerKv::unwritten(heads, seq, headDim);
    for (std::int64_t pos = 0; pos < seq; ++pos) {
        if (!present[std::size_t(pos)])
            continue;
        decodeRows(KvPart::K, pos, pos + 1, out.k.data() + out.index(0, pos));
        decodeRows(KvPart::V, pos, pos + 1, out.v.data() + out.index(0, pos));
        out.present[std::size_t(pos)] = 1;
    }
    out.clearAbsent();
    return out;
}

}  // namespace kvscope
