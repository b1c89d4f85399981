#pragma once
// A Mamba2 mixer (Dao & Gu 2024, "Transformers are SSMs"; as HF transformers' Mamba2Mixer and
// vLLM's MambaMixer2 compute it), stepped one token at a time so that its state after any
// position is exact, in the synthetic models' three numerics (numerics.h, docs/synth.md).
// Internal to the synthetic generator: the hybrid model's state-space layers.
//
// Per token, from the normed input u: in_proj(u) = (z, xBC, dt); xBC through a causal depthwise
// convolution of width convWidth and SiLU, split into x (heads x headDim), B and C (groups x
// stateSize each); dt = softplus(dt + dt_bias); per head h (group g = h / (heads / groups)):
// state_h = exp(dt_h A_h) state_h + dt_h x_h B_g^T (A_h = -exp(A_log_h)), y_h = state_h C_g +
// D_h x_h; y = RMSNorm_per_group(y * silu(z)) * norm_weight; out_proj(y).

#include "synth/model_capture.h"
#include "synth/numerics.h"

#include <cstdint>
#include <functional>
#include <vector>

namespace kvscope::synth {

// What a Mamba2 layer carries from one token to the next.
struct Mamba2State {
    std::vector<float> conv;  // [convDim, convWidth - 1]: the last inputs of the convolution, oldest first
    std::vector<float> ssm;   // [heads, headDim, stateSize]
};

class Mamba2Mixer {
public:
    struct Weights {
        Matrix inProj;                // [hidden, inner (z) + convDim (xBC) + heads (dt)]
        Matrix conv;                  // [convDim, convWidth], the last column weighs the current token
        std::vector<float> convBias;  // [convDim]
        std::vector<float> dtBias;    // [heads]
        std::vector<float> aLog;      // [heads]
        std::vector<float> d;         // [heads]
        std::vector<float> norm;      // [inner]
        Matrix outProj;               // [inner, hidden]
    };

    // Deterministic weights from `seed`, drawn from one normal stream in this order: inProj
    // (std 1/sqrt(hidden)), conv (std 1/sqrt(convWidth)), convBias (0.1), D (1 + 0.1 N), norm
    // (1 + 0.1 N), outProj (0.5/sqrt(inner)). dt_bias and A_log are spread over the heads as
    // Mamba2 initialises them: dt from 0.001 to 0.1 (log-spaced; dt_bias its inverse softplus),
    // A from 1 to 16, so heads remember from a few tokens to thousands.
    Mamba2Mixer(int hidden, const Mamba2Shape& shape, std::uint64_t seed);
    // Given fp32 weights (tests).
    Mamba2Mixer(const Mamba2Shape& shape, Weights fp32);

    const Mamba2Shape& shape() const { return m_shape; }
    // The fp32 master weights (Baseline) or the same rounded to bf16 (Expected, Engine).
    const Weights& weights(Numerics n) const { return n == Numerics::Baseline ? m_fp32 : m_bf16; }
    // A request's first state: zeros.
    Mamba2State initialState() const;

    // Called after each token's step with the token's row in `h`; it may change the state (an
    // engine fault) or keep a copy (a checkpoint).
    using AfterToken = std::function<void(int row, Mamba2State& state)>;
    // Runs the rows of `h` [n, hidden] in order from `state` (updated) and returns [n, hidden].
    Matrix forward(const Matrix& h, Mamba2State& state, Numerics n, const AfterToken& afterToken = {}) const;

private:
    Mamba2Shape m_shape;
    Weights m_fp32;
    Weights m_bf16;
};

}  // namespace kvscope::synth
