#pragma once
// Compares one layer of one prompt: every (token, head) metric for K and V, and the
// per-token Bhattacharyya coefficient between the base and target error sets.
//
// Two-way: reference = expected, target = actual, no base.
// Three-way: reference = baseline, target = actual, base = expected.
// A token is compared only where every side holds it; elsewhere its cells stay NaN.

#include "analysis_result.h"
#include "bhattacharyya.h"
#include "layer_kv.h"

#include <vector>

namespace kvscope {

// Per token, the range of both error sets together (empty where absent): what cross-prompt
// aggregation needs to choose shared bin edges without keeping the errors.
struct TokenErrorRanges {
    std::vector<ErrorRange> k;
    std::vector<ErrorRange> v;
    const std::vector<ErrorRange>& of(KvPart part) const { return part == KvPart::K ? k : v; }
};

// Writes layer `layer` of `out` (which must be allocated with matching tokens and heads);
// only that layer's cells are touched, so layers may be compared concurrently. Cells whose
// input holds NaN or infinity stay NaN and are listed in `nonFinite`.
// Throws std::invalid_argument when the shapes of the sides differ.
void compareLayer(const LayerKv& reference, const LayerKv& target, const LayerKv* base, int layer,
                  PromptAnalysis& out, std::vector<NonFiniteCell>& nonFinite, TokenErrorRanges* ranges = nullptr);

// Whether every side holds `token`.
bool comparable(const LayerKv& reference, const LayerKv& target, const LayerKv* base, std::int64_t token);

// Adds |reference - x| of every head at `token` to `histogram` on `bins` (for pooling).
void addTokenErrors(const LayerKv& reference, const LayerKv& x, std::int64_t token, KvPart part,
                    const SharedBins& bins, Histogram& histogram);

}  // namespace kvscope
