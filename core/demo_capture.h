#pragma once
// A small synthetic capture for the demo and the tests, made without a model: the baseline
// is random KV with a few outlier channels (as real K has), "expected" is the baseline in
// bf16, and the engine is the baseline perturbed below bf16 resolution and rounded, so a
// clean engine differs from the baseline the way bf16 does. One fault can be injected.
// It exercises the whole format: two groups (sliding window and full attention) with their
// own block sizes, TP shards, shuffled block tables, and two snapshots around a divergence.

#include "kv_cache_config.h"

#include <cstdint>
#include <string>
#include <vector>

namespace kvscope {

struct DemoCaptureOptions {
    int layers = 8;             // alternating sliding window (even) / full attention (odd)
    int kvHeads = 4;
    int headDim = 32;
    int tpSize = 2;
    int fullBlockSize = 16;
    int slidingBlockSize = 8;
    int slidingWindow = 24;
    std::vector<int> promptLens{40, 56};
    int decodeTokens = 20;
    std::uint64_t seed = 7;
    // The fault: from `faultPosition` (relative to the end of the prompt) on, one head of one
    // layer has its K rotated, as a wrong RoPE position would. faultLayer < 0: no fault.
    int faultLayer = 5;
    int faultHead = 1;
    int faultPosition = 6;
    // Where the engine's token differed from the teacher's (relative to the end of the prompt).
    int divergence = 9;
};

// Writes the capture to `path`. Throws BundleError on I/O failure.
void writeDemoCapture(const std::string& path, const DemoCaptureOptions& options = {});

}  // namespace kvscope
