#pragma once
// A small decoder-only transformer in libtorch, run in three numerics. Internal to the
// synthetic generator (model_capture.cpp): nothing outside core/synth includes torch.

#include "model_capture.h"

#include <torch/torch.h>

#include <cstdint>
#include <vector>

namespace kvscope::synth {

enum class Numerics {
    Baseline,  // fp32 throughout
    Expected,  // bf16 as HF runs it: bf16 matmuls, RMSNorm rounded before the weight
    Engine,    // bf16 storage with fp32 normalisation and fp32-accumulated matmuls rounded once
};

// Engine-side faults that change what the engine computes.
struct EngineFaults {
    int ropeOffsetLayer = -1;  // K of decode positions rotated for position + 1
    int deadLayer = -1;        // one KV head zeroed from a position on
    int deadHead = -1;
    std::int64_t deadFrom = 0;
    bool windowOffByOne = false;  // sliding layers attend to one position too few
};

// K and V of one layer for positions [0, t): [kvHeads, t, headDim], float32 holding values of
// the numerics' storage type.
struct LayerCache {
    torch::Tensor k;
    torch::Tensor v;
};

class TinyTransformer {
public:
    TinyTransformer(const ModelShape& shape, std::uint64_t seed);

    const ModelShape& shape() const { return m_shape; }
    bool sliding(int layer) const { return layer % 2 == 0; }

    // Runs `tokens` at positions [start, start + n) after `cache` (positions [0, start)),
    // appends their K and V to `cache` and returns the logits [n, vocab] (float32).
    // `promptLen` tells the faults where decoding starts.
    torch::Tensor forward(const std::vector<std::int64_t>& tokens, std::int64_t start, std::vector<LayerCache>& cache,
                          Numerics numerics, const EngineFaults& faults = {}, std::int64_t promptLen = 0) const;

private:
    struct Layer {
        torch::Tensor attnNorm, wq, wk, wv, wo, mlpNorm, wGate, wUp, wDown;
    };
    struct Weights {
        torch::Tensor embed, finalNorm, lmHead;
        std::vector<Layer> layers;
    };
    torch::Tensor linear(const torch::Tensor& x, const torch::Tensor& w, Numerics n) const;
    torch::Tensor rmsNorm(const torch::Tensor& x, const torch::Tensor& w, Numerics n) const;
    torch::Tensor rope(const torch::Tensor& x, const torch::Tensor& positions, Numerics n) const;
    const Weights& weightsFor(Numerics n) const;

    ModelShape m_shape;
    Weights m_fp32;  // master weights
    Weights m_bf16;  // the same rounded to bf16 (kept as float32 values)
};

}  // namespace kvscope::synth
