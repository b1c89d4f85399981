#pragma once
// The producer's rows by fingerprint: every written row (one head of one position, K or V) of
// one layer, in every snapshot of every prompt, keyed by a hash of its values, so that where a
// consumer's changed row came from (another position of the prompt, another request's block,
// what a block held earlier) is one lookup, not a comparison with every block. Rows all zero
// are left out (never-written blocks are told apart without them), as are an earlier
// snapshot's rows that the last one still holds. The last snapshot's last block is indexed
// whole, its rows past the written positions too (a block read from elsewhere brings them).

#include "format/paged_kv.h"
#include "transfer/layer_blocks.h"

#include <atomic>
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <unordered_map>
#include <vector>

namespace kvscope {

class CaptureLoader;

struct RowOrigin {
    std::uint32_t prompt = 0;    // index among the producer's prompts
    std::uint32_t snapshot = 0;
    bool lastSnapshot = true;    // the prompt's final state (else what an earlier snapshot held)
    std::int64_t position = 0;
    std::int64_t entry = 0;      // block-table entry (position / block_size)
    std::int64_t physicalBlock = -1;
    int head = 0;
    KvPart part = KvPart::K;
};

class ProducerRows {
public:
    // Every prompt and snapshot of `producer`'s `layer` (reads each once); throws
    // TransferCancelled when `cancel` is set meanwhile.
    static ProducerRows ofLayer(const CaptureLoader& producer, const std::string& layer,
                                const std::atomic<bool>* cancel = nullptr);

    // A snapshot's blocks; rows of an earlier snapshot equal to `last`'s at the same place are
    // skipped (`last` null: none).
    void add(const LayerBlocks& blocks, std::uint32_t prompt, std::uint32_t snapshot, bool lastSnapshot,
             const LayerBlocks* last = nullptr);
    // Every row of the same values and width (either part).
    std::vector<RowOrigin> find(const float* row, int width) const;
    std::size_t size() const { return m_rows.size(); }
    // How many positions a prompt's snapshot had written (rows past them never were: zeros, or
    // whatever the block held).
    std::int64_t written(std::uint32_t prompt, std::uint32_t snapshot) const;

    // The fingerprint of `width` values (none for a row all zero or with a NaN: 0).
    static std::uint64_t fingerprint(const float* row, int width);

private:
    std::unordered_multimap<std::uint64_t, RowOrigin> m_rows;
    std::map<std::pair<std::uint32_t, std::uint32_t>, std::int64_t> m_written;
};

}  // namespace kvscope
