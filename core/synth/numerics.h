#pragma once
// The synthetic models' three numerics and the pieces every layer shares: a row-major matrix,
// the GEMM with each numerics' summation order and rounding, and SiLU (docs/synth.md). Internal
// to the synthetic generator (tiny_transformer.cpp, mamba2_mixer.cpp).

#include "util/deterministic_math.h"

#include <vector>

namespace kvscope::synth {

enum class Numerics {
    Baseline,  // fp32 throughout
    Expected,  // bf16 as HF runs it on a GPU: bf16 GEMMs with fp32 accumulation, eager attention
    Engine,    // bf16 with fused kernels: split-K GEMMs, fp32 norms and RoPE, flash-style attention
};

// Row-major float matrix.
struct Matrix {
    int rows = 0;
    int cols = 0;
    std::vector<float> values;

    Matrix() = default;
    Matrix(int r, int c) : rows(r), cols(c), values(std::size_t(r) * std::size_t(c)) {}
    float* row(int r) { return values.data() + std::size_t(r) * std::size_t(cols); }
    const float* row(int r) const { return values.data() + std::size_t(r) * std::size_t(cols); }
};

// A rows x cols matrix of normal(0, stddev) values drawn from `normal` in row-major order: the
// synthetic models' deterministic weights.
Matrix randomMatrix(detmath::NormalSampler& normal, int rows, int cols, double stddev);

// y = x w (w [in, out]): products summed in fp32 in order of k (the engine: in chunks of 64,
// then the chunk sums in order); bf16 output but for the baseline.
Matrix linear(const Matrix& x, const Matrix& w, Numerics n);
// Each value to the nearest bf16.
void roundInPlace(std::vector<float>& values);
// x / (1 + e^-x), in double, rounded to float.
float silu(float x);

}  // namespace kvscope::synth
