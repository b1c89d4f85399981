#pragma once
// A results file of any size made without a capture: the full-size fixture of the app and the
// benchmark (an 80-layer x 128k-token capture would not fit a desktop's disk, its results file
// does). One prompt, a Llama-shaped model (one full-attention group, bf16, TP 8), every cell's
// metrics drawn as dtype noise would give them, and one fault: from three quarters of the
// prompt on, one head of the later layers is 25 times its noise. Its bundle is not at hand
// (there is none), as a colleague's results file without the capture would be.

#include <cstdint>
#include <string>

namespace kvscope {

struct SyntheticResultsOptions {
    int layers = 80;
    std::int64_t tokens = 131072;
    int kvHeads = 8;
    bool threeWay = true;
    std::uint64_t seed = 7;
};

// Writes it to `path` (analyze --save's writer; arrays beyond the results budget in temporary
// files). Throws BundleError on I/O failure, std::invalid_argument on a shape it cannot make.
void writeSyntheticResults(const std::string& path, const SyntheticResultsOptions& options);

}  // namespace kvscope
