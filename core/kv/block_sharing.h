#pragma once
// Prefix caching: prompts of one capture whose engine shared physical blocks. vLLM shares a full
// block between requests whose tokens agree up to the block's end; such a block holds one KV for
// all of them. Two prompts share a block here when their block tables (the snapshot that wrote
// it) point at the same physical block for the same logical block of a group, the block is full,
// and their tokens agree from the first up to its end (within one bundle of a sweep: separate
// engines share nothing). Pooled statistics count a shared block's
// tokens once (for the first prompt that holds it), and a finding in one names who shares it.

#include "kv/capture_loader.h"

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace kvscope {

class BlockSharing {
public:
    // The prompts `promptIds` of `loader`, in that order (an earlier prompt pools a shared block).
    BlockSharing(const CaptureLoader& loader, const std::vector<std::string>& promptIds);

    // Whether position `pos` of prompt `prompt` (an index into promptIds) in `group` lies in a block
    // that an earlier prompt with `counted[j]` set also holds.
    bool heldEarlier(std::size_t prompt, int group, std::int64_t pos, const std::vector<char>& counted) const;
    // Per position of `prompt` in `group` (`length` of them): heldEarlier.
    std::vector<std::uint8_t> heldEarlierMask(std::size_t prompt, int group, std::int64_t length,
                                              const std::vector<char>& counted) const;
    // Every prompt (ids, in order, itself included) that holds the block of `pos`, with its
    // physical id; empty when no other prompt does.
    struct Sharing {
        std::int64_t physical = -1;
        std::vector<std::string> prompts;
    };
    Sharing sharedAt(std::size_t prompt, int group, std::int64_t pos) const;
    bool any() const { return m_any; }

private:
    // Per prompt and group, per logical block: its key into m_holders, or -1 when it is not full
    // or not written by one snapshot.
    std::vector<std::vector<std::vector<std::int64_t>>> m_blockKey;
    std::vector<std::vector<std::int64_t>> m_blockSize;        // [prompt][group]: positions per table entry
    std::vector<std::vector<std::size_t>> m_holders;           // [key]: prompt indices, in order
    std::vector<std::int64_t> m_physical;                      // [key]
    std::vector<std::string> m_ids;
    bool m_any = false;
};

}  // namespace kvscope
