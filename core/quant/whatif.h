#pragma once
// The what-if: what would storing this model's KV in fp8 (int8, int4, NVFP4) cost? The
// reference KV (expected) is quantised with each scheme, decoded, and compared with itself:
// per cell (token, head, part) the relative L2 error the scheme adds, and that error over the
// bf16 noise floor of the same cell. The floor is what bf16 already costs there: with a
// baseline, expected against the fp32 baseline; without, the rounding error bf16 gives these
// very values (per element half a unit in the last place, RMS ulp / sqrt(12)).
//
// A layer "is hurt" by a scheme when one of its heads does more than twice as badly as the
// layers' typical worst head (median relative L2 over the head's cells): the format does much
// worse on that layer's values than on the rest of the model, which is what a scale shared
// by very different heads, outlier channels and saturation do. Relative error, not the floor
// ratio: the bf16 floor itself grows with depth.

#include "kv/capture_loader.h"
#include "quant/quant_scheme.h"

#include <atomic>
#include <functional>
#include <string>
#include <vector>

namespace kvscope {

class WorkTeam;

struct WhatIfCell {
    std::string prompt;
    std::int64_t token = 0;
    int head = 0;
    KvPart part = KvPart::K;
    double relL2 = 0;       // |quantised - expected| / |expected|
    double floorRatio = 0;  // relL2 over the cell's bf16 floor
};

struct WhatIfLayer {
    std::string layer;
    double relL2Median[2] = {0, 0};       // [K/V], over tokens, heads and prompts
    double floorRatioMedian[2] = {0, 0};  // [K/V]
    // [K/V]: the 90th percentile over tokens of the layer's map (a token's worst head): what the
    // median of cells hides when most are untouched (KIVI's full-precision recent tokens).
    double floorRatioP90[2] = {0, 0};
    double saturated[2] = {0, 0};         // [K/V]: share of values clipped
    double worstHeadRelL2[2] = {0, 0};    // [K/V]: the largest of the heads' median relative L2
    int worstHead[2] = {-1, -1};
    double kOutlierChannel = 0;           // K's largest channel amax over its median channel amax
    std::vector<WhatIfCell> worst;        // the largest floor ratios, worst first
    bool hurt = false;
};

struct WhatIfScheme {
    QuantScheme scheme;
    std::vector<WhatIfLayer> layers;
    double typicalRatio = 0;     // median over layers of max(K, V) floorRatioMedian
    double typicalWorstHead = 0;  // median over layers of max(K, V) worstHeadRelL2
    std::string verdict;      // one line
    // Per prompt, [K/V][layer][token]: the largest floor ratio over heads (NaN: no data).
    std::vector<std::array<std::vector<float>, 2>> maps;
};

struct WhatIfResult {
    std::string bundle;
    std::string floor;  // "baseline" or "bf16_rounding"
    std::vector<std::string> promptIds;
    std::vector<std::int64_t> promptTokens;
    std::vector<std::string> layers;
    double bf16FloorMedian[2] = {0, 0};  // [K/V]: the floor's typical relative L2
    std::vector<WhatIfScheme> schemes;
    std::vector<std::string> problems;
};

struct WhatIfOptions {
    std::vector<QuantScheme> schemes = defaultSchemes();
    int worstCells = 5;
    WorkTeam* team = nullptr;
    std::function<void(int done, int total)> progress;
    const std::atomic<bool>* cancel = nullptr;
};

// Reads each layer's expected (and baseline) once, for every scheme; layers in parallel over
// the team. Throws BundleError when a prompt's reference cannot be read.
WhatIfResult runWhatIf(const CaptureLoader& loader, const WhatIfOptions& options);

// The rounding error bf16 gives `x` (n values): RMS over elements of ulp / sqrt(12), relative
// to |x|_2.
double bf16RoundingFloor(const float* x, int n);

}  // namespace kvscope
