#pragma once
// The Bhattacharyya coefficient between two sets of absolute errors, as the reference tool
// defines it: 100 equal-width bins over [min, max] of both sets together, p = counts /
// (sum + 1e-10), BC = sum sqrt(p q) clipped to [0, 1]; an empty set gives 0.
//
// Pooling many sets is exact only on shared bin edges, so the histogram is split in two
// steps: a Range (min/max, mergeable), then counts on the range's bins.

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

// numpy.histogram's binning (bins equal-width over [lo, hi], the last bin closed; a range
// of zero width is widened by 0.5 on each side), including its edge corrections.
class SharedBins {
public:
    explicit SharedBins(ErrorRange range, int bins = kBcBins);
    int bins() const { return m_bins; }
    double lo() const { return m_lo; }
    double hi() const { return m_hi; }
    double edge(int i) const;
    // Bin of `value`, or -1 when outside [lo, hi].
    int binOf(double value) const;

private:
    int m_bins;
    double m_lo;
    double m_hi;
    double m_step;
};

struct Histogram {
    std::vector<std::uint64_t> counts;
    explicit Histogram(int bins = kBcBins) : counts(std::size_t(bins), 0) {}
    void add(const SharedBins& bins, double value)
    {
        const int b = bins.binOf(value);
        if (b >= 0)
            ++counts[std::size_t(b)];
    }
    void merge(const Histogram& other);
    std::uint64_t total() const;
};

double bhattacharyya(const Histogram& p, const Histogram& q);

// Both steps on two in-memory sets.
double bhattacharyyaOfSets(const std::vector<double>& a, const std::vector<double>& b);

}  // namespace kvscope
