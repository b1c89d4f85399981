#pragma once
// Error histograms for the drill-down: the base (|baseline - expected|) and actual
// (|baseline - actual|) errors of one head, on shared bins, with their Bhattacharyya
// coefficient; two-way captures have only the actual (|expected - actual|). The errors come
// from analysis/head_error_histogram.h, which reads them from a bundle.

#include "metrics/bhattacharyya.h"

#include <cmath>
#include <optional>
#include <vector>

namespace kvscope {

// The same errors binned for display, where one distribution may be 1000 times wider than
// the other (a fault against dtype noise): log-spaced bins from the smallest positive error to
// the largest (exact zeros counted apart), or linear bins from 0 to the 99th percentile of all
// the errors with what lies above counted apart, so that a few huge errors do not squeeze the
// rest into the first bin.
struct DisplayBins {
    bool logarithmic = false;
    std::vector<double> edges;          // bins + 1, increasing (empty: no errors)
    std::vector<double> base, actual;   // counts per bin; base empty when two-way
    std::int64_t baseApart = 0;         // log: errors exactly 0; linear: above the last edge
    std::int64_t actualApart = 0;
};
DisplayBins logDisplayBins(const std::vector<float>& base, const std::vector<float>& actual, int bins = 60);
DisplayBins linearDisplayBins(const std::vector<float>& base, const std::vector<float>& actual, int bins = 60);

struct HeadErrorHistogram {
    double lo = 0;
    double hi = 0;
    int bins = kBcBins;
    std::optional<Histogram> base;
    Histogram actual;
    std::int64_t tokensUsed = 0;  // tokens in the range that every side holds
    float bc = std::nanf("");    // three-way only
    DisplayBins logBins, linearBins;  // for display
};

// The histograms of `actualErrors` and `baseErrors` (null when two-way) on shared bins, from
// `tokens` tokens' values.
HeadErrorHistogram errorHistogram(const std::vector<float>* baseErrors, const std::vector<float>& actualErrors,
                                  std::int64_t tokens, int bins = kBcBins);

}  // namespace kvscope
