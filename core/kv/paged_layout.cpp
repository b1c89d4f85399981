#include "kv/paged_layout.h"

#include "format/int4_rht.h"
#include "format/nvfp4.h"

#include "util/deterministic_math.h"

#include "kv/reconstruction.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <deque>
#include <stdexcept>

namespace kvscope {

PagedLayout::PagedLayout(const KvCacheConfig& config, std::int64_t seqLen, std::uint64_t seed, int padding)
    : m_config(config)
    , m_seqLen(seqLen)
    , m_seed(seed)
{
    std::mt19937_64 rng(seed);
    std::vector<std::int32_t> pool;
    for (std::int32_t b = 1; b < config.numBlocks; ++b)
        pool.push_back(b);
    std::shuffle(pool.begin(), pool.end(), rng);
    std::deque<std::int32_t> free(pool.begin(), pool.end());

    const std::int64_t written = seqLen - 1;
    m_tables.resize(config.groups.size());
    m_writtenTo.resize(config.groups.size());
    m_freed.resize(config.groups.size());
    std::vector<std::int64_t> nextBlock(config.groups.size(), 0);
    std::vector<std::int64_t> nextToFree(config.groups.size(), 0);  // blocks leave the window in order
    for (std::size_t g = 0; g < config.groups.size(); ++g) {
        if (config.groups[g].specType == SpecType::NotCompared) {  // no KV: an empty table
            m_tables[g] = BlockTable{1, 1, {-1}};
            continue;
        }
        const std::int64_t span = config.positionsPerEntry(config.groups[g]);
        const std::int64_t cols = (seqLen + span - 1) / span + padding;
        m_tables[g] = BlockTable{1, cols, std::vector<std::int32_t>(std::size_t(cols), -1)};
    }
    // Grow the sequence one token at a time across all groups, as the engine does.
    for (std::int64_t pos = 0; pos < seqLen; ++pos) {
        for (std::size_t g = 0; g < config.groups.size(); ++g) {
            const KvCacheGroup& group = config.groups[g];
            if (group.specType == SpecType::NotCompared)
                continue;
            const std::int64_t span = config.positionsPerEntry(group);  // one entry: a block on each DCP rank
            const std::int64_t block = pos / span;
            if (block == nextBlock[g]) {
                if (free.empty())
                    throw std::invalid_argument("PagedLayout: num_blocks too small for the sequence");
                m_tables[g].entries[std::size_t(block)] = free.front();
                m_writtenTo[g].push_back(free.front());
                free.pop_front();
                ++nextBlock[g];
            }
            if (group.specType == SpecType::SlidingWindow || group.specType == SpecType::ChunkedLocal) {
                // Blocks wholly before the first held position go back to the pool, at its
                // front: the next allocation reuses them, so they soon hold other data. Their
                // table entries become the null block (-1), or, every other one, keep the
                // stale id, as engines report both; readers must not read either.
                const std::int64_t firstHeld = firstHeldPosition(group, std::min(pos + 1, written));
                for (std::int64_t& b = nextToFree[g]; b < firstHeld / span; ++b) {
                    std::int32_t& entry = m_tables[g].entries[std::size_t(b)];
                    if (entry >= 0 && !m_freed[g].count(b)) {
                        free.push_front(entry);
                        m_freed[g].insert(b);
                        if (b % 2 == 0)
                            entry = -1;
                    }
                }
            }
        }
    }
}

std::int32_t PagedLayout::physicalOf(std::size_t group, std::int64_t logical) const
{
    return m_writtenTo.at(group).at(std::size_t(logical));
}

void PagedLayout::pin(std::size_t group, std::int64_t logical, std::int32_t physical)
{
    const std::int32_t own = physicalOf(group, logical);
    if (physical < 0 || physical >= m_config.numBlocks)
        throw std::invalid_argument("PagedLayout::pin: block " + std::to_string(physical) + " outside the pool");
    const auto relabel = [&](std::int32_t& id) {
        if (id == own)
            id = physical;
        else if (id == physical)
            id = own;
    };
    for (std::size_t g = 0; g < m_config.groups.size(); ++g) {
        for (std::int32_t& id : m_writtenTo[g])
            relabel(id);
        for (std::int32_t& id : m_tables[g].entries)
            relabel(id);
    }
}

RawTensor PagedLayout::encode(DType dtype, const std::vector<std::int64_t>& shape, const std::vector<float>& values,
                              const CacheScaling& scaling, KvPart part, const TpLayout& layout, int rank) const
{
    // vLLM's 4-bit caches, quantised as its kernels do: NVFP4 under the tensor's scale as its
    // global one, int4 per token and head rotated with kvscope's fixed signs.
    if (dtype == DType::Float4E2M1)
        return nvfp4Tensor(shape, values, part == KvPart::K ? scaling.k : scaling.v);
    if (dtype == DType::Int4TokenHead)
        return int4RhtTensor(shape, values, kvscopeRhtSigns(int(shape[3])));
    if (!isQuantised(dtype))  // the unquantised part of a group whose other part is (a v_dtype)
        return RawTensor::fromFloat(dtype, shape, values);
    switch (scaling.granularity) {
    case ScaleGranularity::Tensor:
        return RawTensor::fromFloat(dtype, shape, values, part == KvPart::K ? scaling.k : scaling.v);
    case ScaleGranularity::Head: {
        const std::vector<float>& all = part == KvPart::K ? scaling.kHeads : scaling.vHeads;
        std::vector<float> scales;
        for (int j = 0; j < shape[1]; ++j)
            scales.push_back(all.at(std::size_t(layout.headOnRank(rank, j))));
        return RawTensor::fromFloat(dtype, shape, values, ScaleGranularity::Head, std::move(scales));
    }
    case ScaleGranularity::TokenGroup:  // fp8_ds_mla: the synth writes no such cache
        throw std::invalid_argument("PagedLayout: a scale per group of a token's values is not synthesised");
    case ScaleGranularity::TokenHead: {
        const std::size_t dim = std::size_t(shape[3]);
        std::vector<float> scales(values.size() / dim);
        for (std::size_t row = 0; row < scales.size(); ++row) {
            float largest = 0;
            for (std::size_t i = 0; i < dim; ++i)
                largest = std::max(largest, std::fabs(values[row * dim + i]));
            scales[row] = std::max(largest / float(maxFinite(dtype)), 1e-6f);  // vLLM's floor of a scale
        }
        return RawTensor::fromFloat(dtype, shape, values, ScaleGranularity::TokenHead, std::move(scales));
    }
    }
    return {};
}

EngineSnapshot PagedLayout::snapshot(const std::function<LayerKv(const std::string&)>& layerKv,
                                     bool keepOnlyReferencedBlocks,
                                     const std::function<CacheScaling(const std::string&)>& scalingOf) const
{
    EngineSnapshot snap;
    snap.seqLens = {m_seqLen};
    snap.blockTables = m_tables;
    snap.keepOnlyReferencedBlocks = keepOnlyReferencedBlocks;
    snap.ranks.resize(std::size_t(m_config.tpSize));
    for (std::size_t g = 0; g < m_config.groups.size(); ++g) {
        const KvCacheGroup& group = m_config.groups[g];
        if (group.specType == SpecType::NotCompared)
            continue;
        const TpLayout layout = m_config.layout(group);
        const int hpr = layout.headsPerRank();
        for (const std::string& layer : group.layerNames) {
            const LayerKv kv = layerKv(layer);
            const CacheScaling scaling = scalingOf && group.quantised() ? scalingOf(layer) : CacheScaling{};
            detmath::NormalSampler n01(m_seed ^ std::hash<std::string>{}(layer));
            for (int r = 0; r < m_config.tpSize; ++r) {
                // Unwritten slots hold noise, drawn K and V alternately (then the wider part's rest).
                std::array<std::vector<float>, 2> x;
                for (KvPart part : {KvPart::K, KvPart::V})
                    x[std::size_t(part)].resize(std::size_t(m_config.numBlocks) *
                                                std::size_t(hpr * group.blockSize * group.partWidth(part)));
                for (std::size_t i = 0; i < std::max(x[0].size(), x[1].size()); ++i)
                    for (std::vector<float>& values : x)
                        if (i < values.size())
                            values[i] = float(n01());
                std::array<RawTensor, 2> parts;
                for (KvPart part : {KvPart::K, KvPart::V}) {
                    const int width = group.partWidth(part);
                    // Blocks are written in allocation order, so a block reused after a freed
                    // window ends up holding the later position's data, as in the engine. Under
                    // DCP a rank writes the positions its DCP rank holds.
                    const std::int64_t span = m_config.positionsPerEntry(group);
                    for (std::size_t b = 0; b < m_writtenTo[g].size(); ++b) {
                        const std::int32_t phys = m_writtenTo[g][b];
                        for (std::int64_t pos = std::int64_t(b) * span; pos < std::int64_t(b + 1) * span; ++pos) {
                            const TokenSlot slot = m_config.slotOf(group, pos);
                            if (pos >= kv.seq || !kv.present[std::size_t(pos)] || slot.dcpRank != m_config.dcpRankOf(r))
                                continue;
                            for (int j = 0; j < hpr; ++j) {
                                const std::size_t dst =
                                    std::size_t(((std::int64_t(phys) * hpr + j) * group.blockSize + slot.offset) * width);
                                std::copy_n(kv.at(part, layout.headOnRank(r, j), pos), width,
                                            x[std::size_t(part)].begin() + std::ptrdiff_t(dst));
                            }
                        }
                    }
                    const std::vector<std::int64_t> shape{m_config.numBlocks, hpr, group.blockSize, width};
                    parts[std::size_t(part)] = encode(group.partDType(part), shape, x[std::size_t(part)], scaling, part, layout, r);
                }
                snap.ranks[std::size_t(r)][layer] = {std::move(parts[0]), std::move(parts[1])};
            }
        }
    }
    return snap;
}

}  // namespace kvscope
