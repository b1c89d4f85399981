#pragma once
// A hand-made prompt analysis the map-side suites share: 2 layers, every cell a tenth of a floor
// (actual error 1e-3 against a three-way base of 1e-2), so that a test sets the few cells it is
// about and knows every other number by hand.

#include "analysis/analysis_result.h"

#include <cstdint>
#include <string>

namespace kvtest {

inline kvscope::PromptAnalysis quietPrompt(std::int64_t tokens, std::int64_t promptLen, int heads, bool threeWay = true,
                                           const std::string& id = "p")
{
    using namespace kvscope;
    PromptAnalysis p;
    p.id = id;
    p.promptLen = promptLen;
    p.tokens = tokens;
    p.heads = heads;
    p.threeWay = threeWay;
    p.layers = {"model.layers.0.self_attn", "model.layers.1.self_attn"};
    p.allocate();
    for (int m = 0; m < kMetricCount; ++m)
        for (std::size_t i = 0; i < p.metrics[std::size_t(m)].size(); ++i)
            p.metrics[std::size_t(m)][i] = isBaseMetric(Metric(m)) ? 1e-2f : 1e-3f;
    return p;
}

// One metric of one head's cell.
inline void setMetric(kvscope::PromptAnalysis& p, kvscope::KvPart part, kvscope::MetricKind kind, int layer, std::int64_t token,
                      int head, float value)
{
    p.metrics[std::size_t(kvscope::metricFor(part, kind))][p.cell(layer, token, head)] = value;
}

}  // namespace kvtest
