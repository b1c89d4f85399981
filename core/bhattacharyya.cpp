#include "bhattacharyya.h"

#include <algorithm>
#include <cmath>

namespace kvscope {

SharedBins::SharedBins(ErrorRange range, int bins)
    : m_bins(bins)
    , m_lo(range.lo)
    , m_hi(range.hi)
{
    if (range.empty()) {
        m_lo = 0;
        m_hi = 1;
    } else if (m_lo == m_hi) {
        m_lo -= 0.5;
        m_hi += 0.5;
    }
    m_step = (m_hi - m_lo) / bins;
}

double SharedBins::edge(int i) const
{
    // numpy.linspace: i * step + start, the last edge exactly `stop`.
    return i == m_bins ? m_hi : double(i) * m_step + m_lo;
}

int SharedBins::binOf(double value) const
{
    if (!(value >= m_lo && value <= m_hi))
        return -1;
    int index = int((value - m_lo) / (m_hi - m_lo) * m_bins);
    if (index >= m_bins)
        index = m_bins - 1;
    if (value < edge(index))
        --index;
    else if (index != m_bins - 1 && value >= edge(index + 1))
        ++index;
    return index;
}

void Histogram::merge(const Histogram& other)
{
    for (std::size_t i = 0; i < counts.size(); ++i)
        counts[i] += other.counts[i];
}

std::uint64_t Histogram::total() const
{
    std::uint64_t n = 0;
    for (std::uint64_t c : counts)
        n += c;
    return n;
}

double bhattacharyya(const Histogram& p, const Histogram& q)
{
    const double sp = double(p.total()) + 1e-10;
    const double sq = double(q.total()) + 1e-10;
    double bc = 0;
    for (std::size_t i = 0; i < p.counts.size(); ++i)
        bc += std::sqrt((double(p.counts[i]) / sp) * (double(q.counts[i]) / sq));
    return std::clamp(bc, 0.0, 1.0);
}

double bhattacharyyaOfSets(const std::vector<double>& a, const std::vector<double>& b)
{
    if (a.empty() || b.empty())
        return 0.0;
    ErrorRange range;
    for (double v : a)
        range.add(v);
    for (double v : b)
        range.add(v);
    const SharedBins bins(range);
    Histogram p, q;
    for (double v : a)
        p.add(bins, v);
    for (double v : b)
        q.add(bins, v);
    return bhattacharyya(p, q);
}

}  // namespace kvscope
