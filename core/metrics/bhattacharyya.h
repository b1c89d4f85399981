#pragma once
// The Bhattacharyya coefficient between two sets of absolute errors, as the reference tool
// defines it: 100 equal-width bins over [min, max] of both sets together, p = counts /
// (sum + 1e-10), BC = sum sqrt(p q) clipped to [0, 1]; an empty set gives 0.
//
// Pooling many sets is exact only on shared bin edges, so the histogram is split in two
// steps: a range (min/max, mergeable), then counts on the range's bins.

#include <cstddef>
#include <cstdint>
#include <limits>
#include <vector>

namespace kvscope {

inline constexpr int kBcBins = 100;

struct ErrorRange {
    double lo = std::numeric_limits<double>::infinity();
    double hi = -std::numeric_limits<double>::infinity();
    bool empty() const { return lo > hi; }
    void add(double value)
    {
        lo = value < lo ? value : lo;
        hi = value > hi ? value : hi;
    }
    void merge(const ErrorRange& other)
    {
        if (other.empty())
            return;
        add(other.lo);
        add(other.hi);
    }
};

struct Histogram {
    std::vector<std::uint64_t> counts;
    explicit Histogram(int bins = kBcBins) : counts(std::size_t(bins), 0) {}
    void merge(const Histogram& other);
    std::uint64_t total() const;
};

// numpy.histogram's binning: `bins` equal-width bins over [lo, hi], edges as numpy.linspace
// makes them, bin i holding edge(i) <= v < edge(i + 1) and the last bin also v == hi; a range
// of zero width is widened by 0.5 on each side.
class SharedBins {
public:
    explicit SharedBins(ErrorRange range, int bins = kBcBins);
    int bins() const { return m_bins; }
    double lo() const { return m_lo; }
    double hi() const { return m_hi; }
    // numpy.linspace's edges: i * step + lo, the last exactly hi (computed when asked: a
    // token's bins are made and used once).
    double edge(int i) const { return i == m_bins ? m_hi : double(i) * m_step + m_lo; }

    // Bin of `value`, or -1 when outside [lo, hi] or NaN.
    int binOf(double value) const
    {
        if (!(value >= m_lo && value <= m_hi))
            return -1;
        int index = int((value - m_lo) * m_scale);
        index = index < 0 ? 0 : (index >= m_bins ? m_bins - 1 : index);
        // The estimate may be one off near an edge; the edges decide, as in numpy.
        if (value < edge(index))
            --index;
        else if (index != m_bins - 1 && value >= edge(index + 1))
            ++index;
        return index;
    }

    // Adds `count` values to `histogram` (values outside the range are skipped).
    void add(const float* values, std::size_t count, Histogram& histogram) const
    {
        add(values, count, histogram.counts.data());
    }
    // The same into `counts` (bins() of them).
    void add(const float* values, std::size_t count, std::uint64_t* counts) const;

private:
    int m_bins;
    double m_lo;
    double m_hi;
    double m_scale;
    double m_step;
};

double bhattacharyya(const std::uint64_t* p, const std::uint64_t* q, int bins);
inline double bhattacharyya(const Histogram& p, const Histogram& q)
{
    return bhattacharyya(p.counts.data(), q.counts.data(), int(p.counts.size()));
}

// Both steps on two in-memory sets.
double bhattacharyyaOfSets(const std::vector<double>& a, const std::vector<double>& b);

}  // namespace kvscope
