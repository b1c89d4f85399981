#pragma once
// Synthetic captures made without a model (fast at any size), for the tests and the benchmark;
// captures from a real model run are core/synth/model_capture.h.
// The baseline is random KV with a few outlier channels (as real K has), "expected" is the
// baseline in bf16, and the engine is the baseline perturbed below bf16 resolution and
// rounded, so a clean engine differs from the baseline the way bf16 does. The engine's KV is
// laid into a paged cache as vLLM would (see paged_layout.h); one fault can be injected.
// Layers are generated one at a time from their own seed, so memory stays small.

#include "synth/model_capture.h"

#include <cstdint>
#include <string>
#include <vector>

namespace kvscope {

struct SyntheticCaptureOptions {
    std::string model = "synthetic";
    int layers = 8;
    bool alternateSliding = true;  // even layers sliding window, odd full attention; else all full
    int kvHeads = 4;
    int headDim = 32;
    int slidingHeadDim = 0;  // the sliding layers' own head size (0: headDim), as some models have
    int slidingKvHeads = 0;  // the sliding layers' own KV head count (0: kvHeads), as some models have
    int tpSize = 2;
    int fullBlockSize = 16;
    int slidingBlockSize = 8;
    int slidingWindow = 24;
    std::vector<int> promptLens{40, 56};
    int decodeTokens = 20;
    // Per prompt (in order), its `provenance` attribute's JSON (format/provenance.h); missing or
    // empty: none recorded.
    std::vector<std::string> provenance;
    bool baseline = true;  // three-way
    // The noise of two bf16 runs of a model (the model-based synth's), instead of rounding
    // alone: expected and the engine each off the baseline by a few bf16 unit roundoffs,
    // growing like sqrt(layer + 1), the engine's scaled per token and head by a log-normal
    // factor. Its clean error ratios follow the model-based synth's (tst_synthetic_capture),
    // so long captures, which a model cannot make in reasonable time, test the suspects.
    bool modelNoise = false;
    std::uint64_t seed = 7;
    // From `faultPosition` (relative to the end of the prompt) on, one head of one layer has
    // its K rotated as RoPE one position too far would. faultLayer < 0: no fault.
    int faultLayer = 5;
    int faultHead = 1;
    int faultPosition = 6;
    // Instead: the fault layer's engine cache holds the layer before's engine KV (other_layer:
    // layer sharing, an index off by one).
    bool faultOtherLayer = false;
    // Where the engine's token differed from the teacher's (relative to the end of the
    // prompt): two snapshots, the first validated up to it. < 0: one snapshot, no divergence.
    int divergence = 9;
    // The engine's cache as real captures have it: a block pool `poolFactor` times what the
    // sequence needs (ids scattered over it), block-table rows `tablePadding` entries longer
    // than needed (-1), and every pool block stored or only the referenced ones.
    int poolFactor = 1;
    int tablePadding = 0;
    bool keepOnlyReferencedBlocks = true;
    // Prefix caching: every later prompt starts with prompt 0's first `sharedPrefixBlocks` full
    // attention blocks (its tokens, KV and reference there), and its block tables point at the
    // physical blocks prompt 0's engine wrote them to.
    int sharedPrefixBlocks = 0;
};

// A small capture exercising the whole format: 8 layers alternating sliding window / full
// attention, 4 KV heads over TP 2, two prompts with a divergence, a RoPE-style fault in
// layer 5, head 1.
SyntheticCaptureOptions demoCaptureOptions();

// Shaped like Llama-3.3-70B: `layers` full-attention layers, 8 KV heads of dim 128, bf16,
// block size 16, TP 8; one prompt of `tokens` positions (half prefill), three-way, no fault;
// laid out as the Python writer's defaults leave a vLLM cache: a pool four times what the
// sequence uses, scattered ids, -1 padding in the tables.
SyntheticCaptureOptions llama70bShape(int tokens, int layers = 80);

// The shape and prompts of a model-based capture (synth/model_capture.h) for this generator,
// with the model's noise: long captures that a model cannot make in reasonable time
// (kvscope synth --model-free). Throws std::invalid_argument for what it cannot make: a fault
// other than rope_offset or other_layer, a quantised cache, DCP, MLA, chunked or state-space layers.
SyntheticCaptureOptions modelFreeOf(const synth::ModelCaptureOptions& model);

// Writes the capture to `path`. Throws BundleError on I/O failure.
void writeSyntheticCapture(const std::string& path, const SyntheticCaptureOptions& options);

}  // namespace kvscope
