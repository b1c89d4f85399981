#pragma once
// The drill-down's error histograms of one head of one layer, K or V, over a token range,
// read from the bundle through its loader: the errors of the tokens every side holds, binned
// by metrics/error_histogram.h.

#include "kv/capture_loader.h"
#include "metrics/error_histogram.h"

#include <string>

namespace kvscope {

// Tokens [tokenBegin, tokenEnd). Throws BundleError on unreadable data and
// std::invalid_argument on a bad head or range.
HeadErrorHistogram headErrorHistogram(const CaptureLoader& loader, const std::string& promptId,
                                      const std::string& layer, int head, KvPart part, std::int64_t tokenBegin,
                                      std::int64_t tokenEnd, int bins = kBcBins);

// The same of a state-space layer's recurrent state (analysis/state_analysis.h): one cell (an
// SSM head, a run of conv channels: `cell` in the analysis's cells of `part`) at the checkpoint
// of `position`, its values' errors against the baseline (three-way) or expected. Throws
// BundleError on unreadable data and std::invalid_argument on a bad part, cell or checkpoint.
HeadErrorHistogram stateErrorHistogram(const CaptureLoader& loader, const std::string& promptId, const std::string& layer,
                                       std::int64_t position, const std::string& part, std::int64_t cell,
                                       int bins = kBcBins);
}  // namespace kvscope
