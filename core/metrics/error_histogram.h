#pragma once
// Per-head error histograms for the drill-down: the base (|baseline - expected|) and actual
// (|baseline - actual|) errors of one head of one layer, K or V, over a token range, on
// shared bins, with their Bhattacharyya coefficient. Two-way captures have only the actual
// (|expected - actual|).

#include "metrics/bhattacharyya.h"
#include "kv/capture_loader.h"

#include <cmath>
#include <optional>
#include <string>

namespace kvscope {

struct HeadErrorHistogram {
    double lo = 0;
    double hi = 0;
    int bins = kBcBins;
    std::optional<Histogram> base;
    Histogram actual;
    std::int64_t tokensUsed = 0;  // tokens in the range that every side holds
    float bc = std::nanf("");    // three-way only
};

// Tokens [tokenBegin, tokenEnd). Throws BundleError on unreadable data and
// std::invalid_argument on a bad head or range.
HeadErrorHistogram headErrorHistogram(const CaptureLoader& loader, const std::string& promptId,
                                      const std::string& layer, int head, KvPart part, std::int64_t tokenBegin,
                                      std::int64_t tokenEnd, int bins = kBcBins);

}  // namespace kvscope
