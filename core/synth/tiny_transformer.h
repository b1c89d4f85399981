#pragma once
// A small decoder-only transformer run in three numerics whose rounding rules are explicit
// (docs/synth.md), so that a synthetic capture is the same bits on every CPU, with any number
// of threads: plain C++ on IEEE basic operations in a fixed order, no BLAS, no libm.
// Internal to the synthetic generator (model_capture.cpp).

#include "synth/mamba2_mixer.h"
#include "synth/model_capture.h"
#include "synth/numerics.h"

#include <cstdint>
#include <vector>

namespace kvscope::synth {

// Engine-side faults that change what the engine computes.
struct EngineFaults {
    int ropeOffsetLayer = -1;  // K of decode positions rotated for position + 1
    int deadLayer = -1;        // one KV head zeroed from a position on
    int deadHead = -1;
    std::int64_t deadFrom = 0;
    bool windowOffByOne = false;  // sliding layers attend to one position too few
    // Q and K rotated another way than the model's (rotated halves over every dim) in
    // `ropeLayer` (-1: every layer) at positions [ropeFrom, ropeTo):
    int ropeLayer = -2;               // -2: no such fault
    std::int64_t ropeFrom = 0;
    std::int64_t ropeTo = INT64_MAX;
    std::int64_t ropeShift = 0;       // rotated for position + shift
    bool ropeRestart = false;         // rotated for position - ropeFrom (chunked prefill restarting)
    double ropeDivide = 1.0;          // positions divided by this (a linear scaling)
    bool ropeInterleaved = false;     // pairs (2i, 2i+1) instead of halves
    int ropeDims = 0;                 // only the first ropeDims values rotate (0: all)
    // K (before RoPE) and V of one head of one layer plus a constant vector (head_dim values each).
    int biasLayer = -1;
    int biasHead = -1;
    std::vector<float> biasK, biasV;
    // A Mamba2 layer's state made wrong after `stateAt` positions, the run continuing from it:
    // the state kept at position stateSource (stale), stateOther (another request's, or zeros),
    // the state plus stateFactor x stateOther (a leftover), or times stateFactor.
    enum class StateFault { None, Stale, Replace, AddScaled, Scale };
    StateFault stateFault = StateFault::None;
    int stateLayer = -1;
    std::int64_t stateAt = 0;
    std::int64_t stateSource = 0;
    Mamba2State stateOther;
    float stateFactor = 1.0f;
    bool ropeApplies(int layer, std::int64_t position) const
    {
        return (ropeLayer == -1 || ropeLayer == layer) && position >= ropeFrom && position < ropeTo;
    }
};

// What one layer cached for positions [0, positions), holding values of the numerics' storage
// type. `k` and `v` are what an engine's cache stores, position-major: K and V [positions,
// kvHeads, headDim], or an MLA layer's c_kv [positions, kvLoraRank] and k_pe [positions,
// ropeHeadDim]. Attention reads the keys per channel, [key heads, key dim, capacity], so that
// scores vectorise over positions, and the values position-major: `v`, or an MLA layer's
// up-projected `values` [positions, query heads, headDim].
struct LayerCache {
    std::int64_t positions = 0;
    std::vector<float> k;
    std::vector<float> v;
    std::vector<float> values;  // MLA only
    std::int64_t capacity = 0;
    std::vector<float> keysByChannel;
    std::size_t keyChannels = 0;

    // A Mamba2 layer's: its state after `positions`, the normed inputs its mixer took
    // [positions, hidden] (to step again from a checkpoint) and the states it kept at checkpoints.
    Mamba2State state;
    std::vector<float> mixerInputs;
    struct Checkpoint {
        std::int64_t positions;
        Mamba2State state;
    };
    std::vector<Checkpoint> checkpoints;

    // The first `count` positions of an attention layer (TinyTransformer::prefix: any layer).
    LayerCache prefix(std::int64_t count) const;
};

class TinyTransformer {
public:
    TinyTransformer(const ModelShape& shape, std::uint64_t seed);

    const ModelShape& shape() const { return m_shape; }
    bool sliding(int layer) const { return !m_shape.mla() && layer % 2 == 0 && !m_shape.isMamba(layer); }

    // Runs `tokens` at positions [start, start + n) after `cache` (positions [0, start)),
    // appends their K and V to `cache` and returns the logits [n, vocab].
    // `promptLen` tells the faults where decoding starts.
    // `residuals`: the residual stream entering each layer, [n, hidden] per layer.
    Matrix forward(const std::vector<std::int64_t>& tokens, std::int64_t start, std::vector<LayerCache>& cache,
                   Numerics numerics, const EngineFaults& faults = {}, std::int64_t promptLen = 0,
                   std::vector<Matrix>* residuals = nullptr) const;

    // How a decode step's layer reads a cache (docs/bundle-format.md, "Impact"): the past [0, q)
    // from `past` and the row's own K and V as computed, or (`whole`) every position [0, q] from
    // `past`. A Mamba2 layer steps from `past`'s state after [0, q).
    struct PastRead {
        const LayerCache* past = nullptr;
        bool whole = false;
    };
    // Teacher-forced decode steps: rows at positions [first, first + rows) entering layer
    // `firstLayer` with `residual`, each layer l >= firstLayer reading reads[l] (every one given).
    // Returns the logits [rows, vocab]. With the caches `forward` made and no `whole`, the same
    // logits as `forward`'s rows.
    Matrix decodeSteps(Matrix residual, std::int64_t first, int firstLayer, const std::vector<PastRead>& reads,
                       Numerics numerics) const;
    // Layer l's cache holding K and V [positions, width] as an engine caches them (an MLA layer's
    // c_kv and k_pe, up-projected with `numerics`' weights), for decodeSteps to read.
    LayerCache cacheOf(int l, const Matrix& k, const Matrix& v, Numerics numerics) const;

    // What `cache` held after its first `count` positions, run with the same numerics and faults
    // (a Mamba2 layer steps again from its last checkpoint at or before `count`).
    std::vector<LayerCache> prefix(const std::vector<LayerCache>& cache, std::int64_t count, Numerics numerics,
                                   const EngineFaults& faults = {}) const;
    // Mamba2 layer `layer`'s state after its first `count` positions (a checkpoint's, or stepped again).
    Mamba2State stateAfter(const LayerCache& cache, int layer, std::int64_t count, Numerics numerics,
                           const EngineFaults& faults = {}) const;

    struct Layer {
        std::vector<float> attnNorm, mlpNorm;
        Matrix wq, wk, wv, wo, wGate, wUp, wDown;  // [in, out]
        // MLA: wk is kv_a_proj_with_mqa [hidden, kvLoraRank + ropeHeadDim], wv kv_b_proj
        // [kvLoraRank, queryHeads * 2 * headDim] (each head's K part, then its V), kvNorm
        // kv_a_layernorm.
        std::vector<float> kvNorm;
    };
    struct Weights {
        Matrix embed, lmHead;
        std::vector<float> finalNorm;
        std::vector<Layer> layers;  // a Mamba2 layer's attention weights are drawn but unused
    };
    // The fp32 master weights (the bf16 numerics run them rounded to bf16), read-only: for a
    // computation of the same model in another precision (the impact tests' double forward).
    const Weights& masterWeights() const { return m_fp32; }

private:
    const Weights& weightsFor(Numerics n) const { return n == Numerics::Baseline ? m_fp32 : m_bf16; }
    // Runs Mamba2 layer `l`'s mixer on the normed rows `h` at positions from `start`: its state,
    // inputs and checkpoints in `cache`, the engine's state fault applied.
    Matrix mamba(int l, const Matrix& h, std::int64_t start, LayerCache& cache, Numerics n, const EngineFaults& faults) const;
    const Mamba2Mixer& mixerOf(int layer) const;
    // An attention layer on the normed rows `h`: its new KV into `cache`, its output projected.
    // `read`: a decode step's (decodeSteps), `cache` then receiving only the rows' own K and V.
    Matrix attentionBlock(const Layer& layer, const Matrix& h, std::int64_t start, int l, LayerCache& cache,
                          Numerics numerics, const EngineFaults& faults, std::int64_t promptLen, PastRead read) const;
    // `own`: row i's own position read from own's row i, the earlier ones from `cache`.
    void attention(const Matrix& q, const LayerCache& cache, std::int64_t start, int layer, Numerics n,
                   const EngineFaults& faults, Matrix& out, const LayerCache* own = nullptr) const;
    // One layer on the residual stream `x` (attention or Mamba2, then the MLP), in place.
    void runLayer(int l, Matrix& x, std::int64_t start, LayerCache& cache, Numerics numerics,
                  const EngineFaults& faults, std::int64_t promptLen, PastRead read) const;
    // Decode steps of a Mamba2 layer: each row from `past`'s state after the positions before it.
    Matrix mambaSteps(int l, const Matrix& h, std::int64_t start, const LayerCache& past, Numerics n) const;
    // An MLA layer's cache rows from c_kv and k_pe: the latents, and each head's K and V up-projected.
    void appendLatent(const Layer& layer, const Matrix& cKv, const Matrix& kPe, Numerics numerics,
                      LayerCache& cache) const;
    // An MLA layer's Q (rotated in place) and its cache's new rows, from the normed input `h`.
    void latentAttentionKv(const Layer& layer, const Matrix& h, Matrix& q, std::int64_t start, int l, Numerics n,
                           const EngineFaults& faults, std::int64_t promptLen, LayerCache& cache) const;

    ModelShape m_shape;
    std::vector<float> m_invFreq;  // RoPE inverse frequencies, fp32
    std::vector<Mamba2Mixer> m_mixers;  // per layer of shape().mambaLayers, in its order
    Weights m_fp32;                // master weights
    Weights m_bf16;                // the same rounded to bf16 (kept as float values)
};

}  // namespace kvscope::synth
