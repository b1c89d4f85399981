#pragma once
// One part (K or V) of one layer quantised the way a scheme would store it, and decoded back:
// what the attention would read from such a cache.

#include "quant/quant_scheme.h"

#include <cstdint>

namespace kvscope {

struct QuantiseInput {
    const float* values = nullptr;        // [seq, heads, dim], position-major (a LayerKv's k or v)
    const std::uint8_t* present = nullptr;  // [seq]; absent positions are copied as they are
    std::int64_t seq = 0;
    int heads = 0;
    int dim = 0;
    bool isK = true;         // KIVI and vLLM's static scales treat K and V differently
    float warmupAmax = 0;    // VllmStatic: the largest magnitude of the warm-up batch
};

struct QuantiseStats {
    std::int64_t values = 0;     // quantised (present) values
    std::int64_t saturated = 0;  // beyond the format's range: clipped
};

// Writes the quantised-and-decoded values to `out` (same layout as the input).
QuantiseStats quantise(const QuantScheme& scheme, const QuantiseInput& in, float* out);

}  // namespace kvscope
