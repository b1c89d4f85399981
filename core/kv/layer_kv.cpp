#include "kv/layer_kv.h"

#include <algorithm>
#include <limits>
#include <numeric>

namespace kvscope {

LayerKv LayerKv::absent(int heads, std::int64_t seq, HeadDims dims)
{
    LayerKv kv = unwritten(heads, seq, dims);
    std::fill(kv.k.begin(), kv.k.end(), std::numeric_limits<float>::quiet_NaN());
    std::fill(kv.v.begin(), kv.v.end(), std::numeric_limits<float>::quiet_NaN());
    return kv;
}

LayerKv LayerKv::unwritten(int heads, std::int64_t seq, HeadDims dims)
{
    LayerKv kv;
    kv.heads = heads;
    kv.seq = seq;
    kv.dims = dims;
    kv.k.resize(std::size_t(heads) * std::size_t(seq) * std::size_t(dims.k));
    kv.v.resize(std::size_t(heads) * std::size_t(seq) * std::size_t(dims.v));
    kv.present.assign(std::size_t(seq), 0);
    return kv;
}

void LayerKv::clearAbsent()
{
    for (std::int64_t pos = 0; pos < seq; ++pos)
        if (!present[std::size_t(pos)])
            clear(pos);
}

std::int64_t LayerKv::presentCount() const
{
    return std::accumulate(present.begin(), present.end(), std::int64_t(0));
}

void LayerKv::clear(std::int64_t pos)
{
    present[std::size_t(pos)] = 0;
    const float nan = std::numeric_limits<float>::quiet_NaN();
    for (KvPart part : {KvPart::K, KvPart::V})
        std::fill_n(values(part).begin() + std::ptrdiff_t(index(part, 0, pos)), rowSize(part), nan);
}

}  // namespace kvscope
