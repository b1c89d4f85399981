#include "transfer/producer_rows.h"

#include "kv/capture_loader.h"
#include "transfer/transfer_pairing.h"
#include "util/content_hash.h"

#include <algorithm>
#include <cmath>

namespace kvscope {

std::uint64_t ProducerRows::fingerprint(const float* row, int width)
{
    bool zero = true;
    for (int d = 0; d < width; ++d) {
        if (std::isnan(row[d]))
            return 0;
        zero = zero && row[d] == 0.0f;
    }
    if (zero)
        return 0;
    ContentHash hash;
    hash.add(std::uint64_t(width));
    hash.add(row, std::size_t(width) * sizeof(float));
    return hash.value() | 1;  // never 0, which stands for "none"
}

void ProducerRows::add(const LayerBlocks& blocks, std::uint32_t prompt, std::uint32_t snapshot, bool lastSnapshot,
                       const LayerBlocks* last)
{
    m_written[{prompt, snapshot}] = blocks.written;
    // The last snapshot's last block is indexed whole: a block is read whole, so a block read
    // from another entry brings the rows past the written ones too (whatever the block held).
    const std::int64_t tailEnd = lastSnapshot && blocks.written > 0
                                     ? std::min(blocks.entries(), blocks.entryOf(blocks.written - 1) + 1) * blocks.blockSize
                                     : blocks.written;
    for (std::int64_t pos = 0; pos < std::max(tailEnd, blocks.written); ++pos) {
        if (pos < blocks.written ? !blocks.present(pos) : !blocks.stored[std::size_t(blocks.entryOf(pos))])
            continue;
        const std::int64_t e = blocks.entryOf(pos);
        const int r = int(pos % blocks.blockSize);
        for (int h = 0; h < blocks.heads; ++h)
            for (KvPart part : {KvPart::K, KvPart::V}) {
                const int width = blocks.dims.of(part);
                const std::uint64_t key = fingerprint(blocks.row(part, e, h, r), width);
                if (!key)
                    continue;
                if (last && last->present(pos) && fingerprint(last->row(part, e, h, r), width) == key)
                    continue;  // still there at the end: the last snapshot's row says it
                m_rows.emplace(key, RowOrigin{prompt, snapshot, lastSnapshot, pos, e, blocks.physical[std::size_t(e)], h, part});
            }
    }
}

std::int64_t ProducerRows::written(std::uint32_t prompt, std::uint32_t snapshot) const
{
    const auto found = m_written.find({prompt, snapshot});
    return found == m_written.end() ? 0 : found->second;
}

std::vector<RowOrigin> ProducerRows::find(const float* row, int width) const
{
    std::vector<RowOrigin> found;
    const std::uint64_t key = fingerprint(row, width);
    if (!key)
        return found;
    const auto [begin, end] = m_rows.equal_range(key);
    for (auto it = begin; it != end; ++it)
        found.push_back(it->second);
    return found;
}

ProducerRows ProducerRows::ofLayer(const CaptureLoader& producer, const std::string& layer,
                                   const std::atomic<bool>* cancel)
{
    ProducerRows rows;
    const std::vector<PromptInfo>& prompts = producer.prompts();
    for (std::size_t i = 0; i < prompts.size(); ++i) {
        const PromptInfo& p = prompts[i];
        if (!p.problems.empty() && !(p.referenceMissing && p.problems.size() == 1))
            continue;  // not readable: nothing of it can be found
        const std::size_t lastIndex = p.snapshots.size() - 1;
        const LayerBlocks last = readLayerBlocks(producer, p.id, lastIndex, layer);
        rows.add(last, std::uint32_t(i), std::uint32_t(lastIndex), true);
        for (std::size_t s = 0; s < lastIndex; ++s) {
            if (cancel && cancel->load())
                throw TransferCancelled();
            rows.add(readLayerBlocks(producer, p.id, s, layer), std::uint32_t(i), std::uint32_t(s), false, &last);
        }
    }
    return rows;
}

}  // namespace kvscope
