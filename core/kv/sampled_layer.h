#pragma once
// A layer's vectors at chosen positions only: what explaining a suspect reads of its onset layer
// (a few thousand positions of a long context), read a window of tokens at a time, so that a
// window and the chosen vectors are all that is in memory (a 131,072-token layer of a 70B model
// is 1 GB of float a side).

#include "kv/layer_kv.h"
#include "kv/layer_source.h"
#include "kv/position_range.h"

#include <array>
#include <cstdint>
#include <functional>
#include <vector>

namespace kvscope {

class SampledLayer {
public:
    SampledLayer() = default;
    // `positions` (any order, repeats allowed; those outside [0, seq) ignored) of a layer of `seq`
    // positions, each window of `windowTokens` that holds one read by `read` and let go.
    static SampledLayer read(std::vector<std::int64_t> positions, std::int64_t seq, std::int64_t windowTokens,
                             const std::function<LayerSource(PositionRange)>& read);
    // Every position of a layer in memory.
    static SampledLayer of(const LayerKv& layer);

    int heads = 0;
    std::int64_t seq = 0;
    HeadDims dims;
    // Head `head`'s vector of `part` at `pos`; null where `pos` was not sampled or is absent.
    const float* at(KvPart part, std::int64_t pos, int head) const;
    std::size_t sampledPositions() const { return m_positions.size(); }

private:
    std::vector<std::int64_t> m_positions;  // sorted
    std::vector<std::uint8_t> m_present;    // per slot
    std::array<std::vector<float>, 2> m_values;  // [K/V][slot][head][dim]
};

}  // namespace kvscope
