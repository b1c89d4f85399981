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

SnapshotMerger::SnapshotMerger(int heads, std::int64_t totalLen, int headDim)
    : m_heads(heads)
    , m_totalLen(totalLen)
    , m_headDim(headDim)
{
}

void SnapshotMerger::add(LayerKv&& snapshot, PositionRange range)
{
    if (m_started || snapshot.seq != m_totalLen) {
        add(static_cast<const LayerKv&>(snapshot), range);
        return;
    }
    if (snapshot.heads != m_heads || snapshot.headDim != m_headDim)
        throw std::invalid_argument("SnapshotMerger: snapshot shape differs from the merged cache");
    m_merged = std::move(snapshot);
    m_started = true;
    for (std::int64_t pos = 0; pos < m_merged.seq; ++pos)
        if (m_merged.present[std::size_t(pos)] && (pos < range.begin || pos >= range.end))
            m_merged.clear(pos);
}

void SnapshotMerger::add(const LayerKv& snapshot, PositionRange range)
{
    if (snapshot.heads != m_heads || snapshot.headDim != m_headDim)
        throw std::invalid_argument("SnapshotMerger: snapshot shape differs from the merged cache");
    if (!m_started) {
        m_merged = LayerKv::absent(m_heads, m_totalLen, m_headDim);
        m_started = true;
    }
    const std::int64_t end = std::min({range.end, snapshot.seq, m_merged.seq});
    for (std::int64_t pos = std::max<std::int64_t>(range.begin, 0); pos < end; ++pos) {
        if (!snapshot.present[std::size_t(pos)])
            continue;
        std::copy_n(snapshot.kAt(0, pos), m_merged.rowSize(), m_merged.k.begin() + std::ptrdiff_t(m_merged.index(0, pos)));
        std::copy_n(snapshot.vAt(0, pos), m_merged.rowSize(), m_merged.v.begin() + std::ptrdiff_t(m_merged.index(0, pos)));
        m_merged.present[std::size_t(pos)] = 1;
    }
}

LayerKv SnapshotMerger::take()
{
    if (!m_started)
        return LayerKv::absent(m_heads, m_totalLen, m_headDim);
    m_started = false;
    return std::move(m_merged);
}

}  // namespace kvscope
