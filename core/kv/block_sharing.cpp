#include "kv/block_sharing.h"

#include "format/bundle_error.h"
#include "kv/snapshot_merge.h"

#include <tuple>

namespace kvscope {

BlockSharing::BlockSharing(const CaptureLoader& loader, const std::vector<std::string>& promptIds)
    : m_ids(promptIds)
{
    const KvCacheConfig& config = loader.config();
    const std::size_t groups = config.groups.size();
    m_blockKey.assign(promptIds.size(), std::vector<std::vector<std::int64_t>>(groups));
    m_blockSize.assign(promptIds.size(), std::vector<std::int64_t>(groups, 1));
    if (promptIds.size() < 2)
        return;  // nothing to share: no block table need be read
    // A token prefix [0, (b + 1) * block_size) by the id of the prefix before it and block b's
    // tokens: equal prefixes get one id, in memory linear in the tokens.
    std::map<std::tuple<int, std::int64_t, std::vector<std::int64_t>>, std::int64_t> prefixIds;
    // Bundle (a sweep's bundles are separate engines), group, logical, physical, prefix.
    std::map<std::tuple<std::size_t, int, std::int64_t, std::int64_t, std::int64_t>, std::int64_t> keys;
    for (std::size_t i = 0; i < promptIds.size(); ++i) {
        try {
            const PromptInfo& info = loader.prompt(promptIds[i]);
            const std::size_t bundle = loader.memberOf(promptIds[i]);
            std::vector<std::int64_t> tokens = info.inputIds;
            tokens.insert(tokens.end(), info.teacherTokens.begin(), info.teacherTokens.end());
            std::vector<SnapshotSpan> spans;
            for (const SnapshotInfo& s : info.snapshots)
                spans.push_back({s.seqLen(), s.validatedUntil});
            const std::vector<PositionRange> ranges = contributedRanges(spans);
            const auto snapshotOf = [&](std::int64_t pos) {
                for (std::size_t s = 0; s < ranges.size(); ++s)
                    if (pos >= ranges[s].begin && pos < ranges[s].end)
                        return int(s);
                return -1;
            };
            const std::int64_t written = info.snapshots.back().seqLen() - 1;
            for (std::size_t g = 0; g < groups; ++g) {
                const KvCacheGroup& group = config.groups[g];
                if (group.specType == SpecType::NotCompared)
                    continue;
                const std::int64_t bs = config.positionsPerEntry(group);  // one table entry's positions
                m_blockSize[i][g] = bs;
                std::vector<BlockTable> tables(info.snapshots.size());
                std::vector<char> read(info.snapshots.size(), 0);
                std::int64_t prefix = -1;
                for (std::int64_t b = 0; (b + 1) * bs <= std::min<std::int64_t>(written, std::int64_t(tokens.size())); ++b) {
                    const std::vector<std::int64_t> own(tokens.begin() + b * bs, tokens.begin() + (b + 1) * bs);
                    prefix = prefixIds.try_emplace({int(bs), prefix, own}, std::int64_t(prefixIds.size())).first->second;
                    const int s = snapshotOf(b * bs);
                    std::int64_t key = -1;
                    if (s >= 0 && snapshotOf((b + 1) * bs - 1) == s) {
                        if (!read[std::size_t(s)]) {
                            tables[std::size_t(s)] = loader.blockTable(promptIds[i], std::size_t(s), g);
                            read[std::size_t(s)] = 1;
                        }
                        const BlockTable& table = tables[std::size_t(s)];
                        const std::int64_t row = info.snapshots[std::size_t(s)].batchRow;
                        const std::int32_t physical = b < table.cols ? table.at(row, b) : -1;
                        if (physical >= 0) {
                            key = keys.try_emplace({bundle, int(g), b, physical, prefix}, std::int64_t(m_holders.size()))
                                      .first->second;
                            if (std::size_t(key) == m_holders.size()) {
                                m_holders.emplace_back();
                                m_physical.push_back(physical);
                            }
                            m_holders[std::size_t(key)].push_back(i);
                            m_any = m_any || m_holders[std::size_t(key)].size() > 1;
                        }
                    }
                    m_blockKey[i][g].push_back(key);
                }
            }
        } catch (const BundleError&) {
            // A prompt whose tables cannot be read shares nothing; its analysis reports why.
        }
    }
}

bool BlockSharing::heldEarlier(std::size_t prompt, int group, std::int64_t pos, const std::vector<char>& counted) const
{
    const std::vector<std::int64_t>& blocks = m_blockKey[prompt][std::size_t(group)];
    const std::int64_t b = pos / m_blockSize[prompt][std::size_t(group)];
    if (b < 0 || b >= std::int64_t(blocks.size()) || blocks[std::size_t(b)] < 0)
        return false;
    for (std::size_t j : m_holders[std::size_t(blocks[std::size_t(b)])])
        if (j < prompt && j < counted.size() && counted[j])
            return true;
    return false;
}

std::vector<std::uint8_t> BlockSharing::heldEarlierMask(std::size_t prompt, int group, std::int64_t length,
                                                        const std::vector<char>& counted) const
{
    std::vector<std::uint8_t> mask(std::size_t(std::max<std::int64_t>(length, 0)), 0);
    if (!m_any)
        return mask;
    for (std::int64_t pos = 0; pos < length; ++pos)
        mask[std::size_t(pos)] = heldEarlier(prompt, group, pos, counted) ? 1 : 0;
    return mask;
}

BlockSharing::Sharing BlockSharing::sharedAt(std::size_t prompt, int group, std::int64_t pos) const
{
    const std::vector<std::int64_t>& blocks = m_blockKey[prompt][std::size_t(group)];
    const std::int64_t b = pos / m_blockSize[prompt][std::size_t(group)];
    if (b < 0 || b >= std::int64_t(blocks.size()) || blocks[std::size_t(b)] < 0)
        return {};
    const std::vector<std::size_t>& holders = m_holders[std::size_t(blocks[std::size_t(b)])];
    if (holders.size() < 2)
        return {};
    Sharing out{m_physical[std::size_t(blocks[std::size_t(b)])], {}};
    for (std::size_t j : holders)
        out.prompts.push_back(m_ids[j]);
    return out;
}

}  // namespace kvscope
