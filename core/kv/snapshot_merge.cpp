#include "kv/snapshot_merge.h"

#include "format/bundle_error.h"

#include <algorithm>
#include <stdexcept>

namespace kvscope {

std::vector<PositionRange> contributedRanges(const std::vector<SnapshotSpan>& spans, const std::string& file,
                                             const std::string& object)
{
    std::vector<PositionRange> ranges;
    std::int64_t begin = 0;
    for (std::size_t i = 0; i < spans.size(); ++i) {
        const SnapshotSpan& s = spans[i];
        const std::string where = object + (object.empty() ? "" : ", ") + "snapshot " + std::to_string(i);
        if (s.validatedUntil > s.seqLen)
            throw BundleError(file, where, "validated_until " + std::to_string(s.validatedUntil) +
                                               " exceeds seq_len " + std::to_string(s.seqLen));
        if (s.validatedUntil < begin)
            throw BundleError(file, where, "validated_until " + std::to_string(s.validatedUntil) +
                                               " goes back before the previous snapshot's " +
                                               std::to_string(begin));
        ranges.push_back({begin, s.validatedUntil});
        begin = s.validatedUntil;
    }
    return ranges;
}

SnapshotMerger::SnapshotMerger(int heads, std::int64_t totalLen, HeadDims dims, int runsPerRow)
    : m_merged(LayerSource::absent(heads, totalLen, dims, runsPerRow))
{
}

void SnapshotMerger::add(const LayerSource& snapshot, PositionRange range)
{
    if (snapshot.heads != m_merged.heads || snapshot.dims != m_merged.dims ||
        snapshot.runsPerRow != m_merged.runsPerRow)
        throw std::invalid_argument("SnapshotMerger: snapshot shape differs from the merged cache");
    const std::int64_t end = std::min({range.end, snapshot.seq, m_merged.seq});
    for (std::int64_t pos = std::max<std::int64_t>(range.begin, 0); pos < end; ++pos) {
        if (!snapshot.present[std::size_t(pos)])
            continue;
        for (KvPart part : {KvPart::K, KvPart::V})
            std::copy_n(snapshot.runs(part, pos), snapshot.runsPerRow, m_merged.runs(part, pos));
        m_merged.present[std::size_t(pos)] = 1;
    }
    m_merged.storage.insert(m_merged.storage.end(), snapshot.storage.begin(), snapshot.storage.end());
}

}  // namespace kvscope
