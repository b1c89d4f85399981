#pragma once
// The impact of a synthetic capture's KV on its model's output (docs/bundle-format.md, "Impact"):
// the model that made the capture decodes each prompt's teacher tokens reading, in some layers,
// the engine's cache as the bundle holds it (read back through the loader: snapshots, TP ranks
// and dequantisation as the analysis sees them), and the KL of its next-token distribution
// against its own is recorded per step: each attention layer alone, each layer and every later
// one, and each layer's own KV quantised by the what-if schemes asked for.

#include "format/impact_record.h"
#include "synth/model_capture.h"
#include "synth/tiny_transformer.h"

#include <string>
#include <vector>

namespace kvscope::synth {

// KL(P || Q) in nats of the softmax distributions of two logit rows, in double precision.
double klDivergence(const float* referenceLogits, const float* otherLogits, int vocab);

// Measures every prompt of the capture at `path`, written by writeModelCapture with `model` and
// `options` (options.impactSchemes: `kvscope whatif` names; an MLA latent is not quantised), and
// adds its impact record. A transplant whose logits are not finite (a NaN in the engine's KV
// reaching the output) is left out.
void addImpact(const std::string& path, const TinyTransformer& model, const ModelCaptureOptions& options);

}  // namespace kvscope::synth
