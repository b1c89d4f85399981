#pragma once
// Per-head error histograms for the drill-down: the base (|baseline - expected|) and actual
// (|baseline - actual|) errors of one head of one layer, K or V, over a token range, on
// shared bins, with their Bhattacharyya coefficient. Two-way captures have only the actual
// (|expected - actual|).

#include "metrics/bhattacharyya.h"
#include "kv/capture_loader.h"

#include <cmath>
#include <optional>
#include <vector>
#include <string>

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

// Tokens [tokenBegin, tokenEnd). Throws BundleError on unreadable data and
// std::invalid_argument on a bad head or range.
HeadErrorHistogram headErrorHistogram(const CaptureLoader& loader, const std::string& promptId,
                                      const std::string& layer, int head, KvPart part, std::int64_t tokenBegin,
                                      std::int64_t tokenEnd, int bins = kBcBins);

}  // namespace kvscope
