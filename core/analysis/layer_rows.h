#pragma once
// One side of a layer comparison, a token's row at a time: a decoded LayerKv (the row is a
// pointer into it), or a LayerSource (float32 as stored is read in place; anything else is
// decoded into the caller's scratch, head by head).

#include "kv/layer_kv.h"
#include "kv/layer_source.h"

#include <algorithm>
#include <optional>
#include <vector>

namespace kvscope {

class LayerRows {
public:
    LayerRows(const LayerKv& kv)  // NOLINT(google-explicit-constructor): either side converts
        : m_kv(&kv)
        , m_heads(kv.heads)
        , m_seq(kv.seq)
        , m_dims(kv.dims)
        , m_present(kv.present.data())
    {
    }
    LayerRows(const LayerSource& source)  // NOLINT(google-explicit-constructor)
        : m_source(&source)
        , m_heads(source.heads)
        , m_seq(source.seq)
        , m_dims(source.dims)
        , m_present(source.present.data())
    {
    }

    int heads() const { return m_heads; }
    std::int64_t seq() const { return m_seq; }
    int headDim(KvPart part) const { return m_dims.of(part); }
    HeadDims dims() const { return m_dims; }
    std::size_t rowSize(KvPart part) const { return std::size_t(m_heads) * std::size_t(m_dims.of(part)); }
    bool present(std::int64_t token) const { return m_present[std::size_t(token)] != 0; }
    // How a LayerSource stores head `head` of present `token` (a decoded LayerKv: nothing known).
    std::optional<LayerSource::Storage> storedAs(KvPart part, std::int64_t token, int head) const
    {
        return m_source ? std::optional(m_source->storedAs(part, token, head)) : std::nullopt;
    }

    // Rows of a LayerSource decoded ahead: kTileTokens consecutive tokens of one part,
    // head-major (a head's tokens follow each other, as in a reference).
    struct Tile {
        std::vector<float> values;
        KvPart part = KvPart::K;
        std::int64_t begin = 0;
        std::int64_t end = 0;
    };
    static constexpr std::int64_t kTileTokens = 16;

    // Every head of `part` at present `token`: in the LayerKv, in the stored float32 tensor,
    // or in `tile`, which decodes the tokens from `token` on when it does not hold them (tokens
    // are best asked for in order; a tile per part).
    RowView row(KvPart part, std::int64_t token, Tile& tile) const
    {
        if (m_kv)
            return {m_kv->values(part).data() + m_kv->index(part, 0, token), std::size_t(headDim(part))};
        if (const RowView stored = m_source->storedFloatRow(part, token); stored.data) {
            if (token + kPrefetchTokens < m_seq && m_present[std::size_t(token + kPrefetchTokens)])
                prefetchRow(m_source->storedFloatRow(part, token + kPrefetchTokens), headDim(part));
            return stored;
        }
        if (tile.part != part || token < tile.begin || token >= tile.end) {
            tile.part = part;
            tile.begin = token;
            tile.end = std::min(m_seq, token + kTileTokens);
            tile.values.resize(std::size_t(kTileTokens) * rowSize(part));
            m_source->decodeHeads(part, tile.begin, tile.end, tile.values.data());
            m_source->prefetchHeads(part, tile.end, std::min(m_seq, tile.end + kTileTokens));
        }
        const std::size_t dim = std::size_t(headDim(part));
        const std::size_t headStride = std::size_t(tile.end - tile.begin) * dim;
        return {tile.values.data() + std::size_t(token - tile.begin) * dim, headStride};
    }

private:
    // A float32 row read in place is its heads' pieces far apart in the tensor (a reference is
    // [heads, seq, head_dim]): more streams than the CPU's prefetchers follow beside the rest.
    static constexpr std::int64_t kPrefetchTokens = 8;
    void prefetchRow(const RowView& row, int dim) const
    {
        if (!row.data)
            return;
        for (int h = 0; h < m_heads; ++h)
            for (int d = 0; d < dim; d += 16)
                __builtin_prefetch(row.head(h) + d);
    }

    const LayerKv* m_kv = nullptr;
    const LayerSource* m_source = nullptr;
    int m_heads;
    std::int64_t m_seq;
    HeadDims m_dims;
    const std::uint8_t* m_present;
};

}  // namespace kvscope
