#pragma once
// Divergence points: recorded in the bundle, or derived from logits as the reference's
// logit validation does (the engine's argmax differs from the teacher token), each with
// whether the logit gap is within the bf16 ULP bound.

#include "analysis/analysis_result.h"
#include "kv/capture_loader.h"

#include <vector>

namespace kvscope {

// n_ulps * 2^(floor(log2|v|) - mantissa_bits); bf16 has 7 mantissa bits.
double ulpBound(double value, int nUlps = 1, int mantissaBits = 7);

// Teacher tokens: the bundle's, else the argmax of the baseline logits, else of the expected
// logits. Recorded divergence positions are used when present (and annotated from the
// actual logits when those exist); otherwise they are derived from the actual logits.
std::vector<Divergence> findDivergences(const CaptureLoader& loader, const PromptInfo& prompt);

}  // namespace kvscope
