#include "transfer/transferred_positions.h"

#include "format/provenance.h"

#include <algorithm>

namespace kvscope {

std::int64_t TransferredPositions::transferredCount() const
{
    std::int64_t n = 0;
    for (const PositionRange& r : transferred)
        n += r.end - r.begin;
    return n;
}

std::vector<PositionRange> rangesOf(const std::vector<std::uint8_t>& flags)
{
    std::vector<PositionRange> ranges;
    for (std::int64_t p = 0; p < std::int64_t(flags.size()); ++p) {
        if (!flags[std::size_t(p)])
            continue;
        if (!ranges.empty() && ranges.back().end == p)
            ranges.back().end = p + 1;
        else
            ranges.push_back({p, p + 1});
    }
    return ranges;
}

namespace {

bool loadedByConnector(const std::vector<ProvenanceRange>& provenance, std::int64_t pos)
{
    if (provenance.empty())
        return true;
    const ProvenanceRange* range = provenanceAt(provenance, pos);
    return range && range->kind == ProvenanceKind::External;
}

}  // namespace

std::vector<std::uint8_t> comparedMask(const LayerBlocks& producer, const LayerBlocks& consumer,
                                       const std::vector<ProvenanceRange>& consumerProvenance)
{
    std::vector<std::uint8_t> mask(std::size_t(std::max(producer.written, consumer.written)), 0);
    for (std::int64_t p = 0; p < std::int64_t(mask.size()); ++p)
        mask[std::size_t(p)] = producer.present(p) && consumer.present(p) && loadedByConnector(consumerProvenance, p);
    return mask;
}

TransferredPositions classifyPositions(const LayerBlocks& producer, const LayerBlocks& consumer,
                                       const std::vector<ProvenanceRange>& consumerProvenance)
{
    const std::int64_t n = std::max(producer.written, consumer.written);
    const std::size_t count = std::size_t(n);
    std::vector<std::uint8_t> transferred(count, 0), missing(count, 0), extra(count, 0), local(count, 0);
    for (std::int64_t p = 0; p < n; ++p) {
        const bool inP = producer.present(p), inC = consumer.present(p);
        const bool loaded = loadedByConnector(consumerProvenance, p);
        transferred[std::size_t(p)] = inP && inC && loaded;
        local[std::size_t(p)] = inP && inC && !loaded;
        missing[std::size_t(p)] = inP && !inC;
        extra[std::size_t(p)] = !inP && inC;
    }
    TransferredPositions t{rangesOf(transferred), rangesOf(missing), rangesOf(extra), rangesOf(local), {}};
    // A partial block: the producer's positions of the block, some of them held by the consumer.
    const std::int64_t bs = producer.blockSize;
    for (std::int64_t e = 0; e * bs < producer.written; ++e) {
        const std::int64_t begin = e * bs, end = std::min(producer.written, (e + 1) * bs);
        std::vector<std::uint8_t> arrived(std::size_t(end), 0);
        std::int64_t held = 0, had = 0;
        for (std::int64_t p = begin; p < end; ++p) {
            if (!producer.present(p))
                continue;
            ++had;
            if (consumer.present(p)) {
                arrived[std::size_t(p)] = 1;
                ++held;
            }
        }
        if (held == 0 || held == had)
            continue;
        PartialBlock block;
        block.block = e;
        block.producerBlock = producer.physical[std::size_t(e)];
        block.consumerBlock = e < consumer.entries() ? consumer.physical[std::size_t(e)] : -1;
        block.positions = {begin, end};
        block.arrived = rangesOf(arrived);
        t.partial.push_back(std::move(block));
    }
    return t;
}

}  // namespace kvscope
