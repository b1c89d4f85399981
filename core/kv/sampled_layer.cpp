#include "kv/sampled_layer.h"

#include <algorithm>

namespace kvscope {

SampledLayer SampledLayer::read(std::vector<std::int64_t> positions, std::int64_t seq, std::int64_t windowTokens,
                                const std::function<LayerSource(PositionRange)>& read)
{
    std::sort(positions.begin(), positions.end());
    positions.erase(std::unique(positions.begin(), positions.end()), positions.end());
    positions.erase(std::remove_if(positions.begin(), positions.end(), [seq](std::int64_t p) { return p < 0 || p >= seq; }),
                    positions.end());
    SampledLayer out;
    out.seq = seq;
    out.m_positions = positions;
    out.m_present.assign(positions.size(), 0);
    const std::int64_t step = std::max<std::int64_t>(1, windowTokens);
    for (std::size_t first = 0; first < positions.size();) {
        const std::int64_t begin = positions[first] / step * step;
        const PositionRange window{begin, std::min(seq, begin + step)};
        std::size_t end = first;
        while (end < positions.size() && positions[end] < window.end)
            ++end;
        const LayerSource source = read(window);
        if (out.m_values[0].empty()) {
            out.heads = source.heads;
            out.dims = source.dims;
            for (KvPart part : {KvPart::K, KvPart::V})
                out.m_values[std::size_t(part)].assign(positions.size() * source.rowSize(part), 0.0f);
        }
        for (std::size_t slot = first; slot < end; ++slot) {
            const std::int64_t pos = positions[slot];
            if (!source.present[std::size_t(pos)])
                continue;
            out.m_present[slot] = 1;
            for (KvPart part : {KvPart::K, KvPart::V})  // one position: head-major is [head][dim]
                source.decodeHeads(part, pos, pos + 1, out.m_values[std::size_t(part)].data() + slot * source.rowSize(part));
        }
        first = end;
    }
    return out;
}

SampledLayer SampledLayer::of(const LayerKv& layer)
{
    SampledLayer out;
    out.heads = layer.heads;
    out.seq = layer.seq;
    out.dims = layer.dims;
    for (std::int64_t pos = 0; pos < layer.seq; ++pos) {
        out.m_positions.push_back(pos);
        out.m_present.push_back(layer.present[std::size_t(pos)]);
        for (KvPart part : {KvPart::K, KvPart::V})
            for (int h = 0; h < layer.heads; ++h) {
                const float* v = part == KvPart::K ? layer.kAt(h, pos) : layer.vAt(h, pos);
                auto& values = out.m_values[std::size_t(part)];
                values.insert(values.end(), v, v + layer.dims.of(part));
            }
    }
    return out;
}

const float* SampledLayer::at(KvPart part, std::int64_t pos, int head) const
{
    const auto it = std::lower_bound(m_positions.begin(), m_positions.end(), pos);
    if (it == m_positions.end() || *it != pos || head < 0 || head >= heads)
        return nullptr;
    const std::size_t slot = std::size_t(it - m_positions.begin());
    if (!m_present[slot])
        return nullptr;
    const std::size_t row = std::size_t(heads) * std::size_t(dims.of(part));
    return m_values[std::size_t(part)].data() + slot * row + std::size_t(head) * std::size_t(dims.of(part));
}

}  // namespace kvscope
