#pragma once
// Synthetic captures from a real (small) model run.
//
// A small decoder-only transformer (GQA, RoPE, RMSNorm, gated MLP, alternating sliding-window
// and full-attention layers; deterministic weights scaled like a trained model's, with
// outlier channels in K) runs teacher-forced three ways on identical tokens: fp32
// "baseline", bf16 "expected" (as HF runs it on a GPU), and a bf16 "engine" with its own
// kernel numerics (split-K GEMMs, fp32 norms and RoPE, flash-style attention), each with
// explicit rounding rules (docs/synth.md): the same bits on every CPU. The engine runs a
// teacher-forced validation loop (one snapshot per generate call, re-fed after each
// divergence) and its KV is laid into a vLLM-like paged cache. One fault can be injected;
// its ground truth goes into the bundle's metadata (attribute `synthetic_fault`, JSON).

#include "format/raw_tensor.h"
#include "format/rope_frequencies.h"

#include <cstdint>
#include <string>
#include <vector>

namespace kvscope::synth {

// The faults it can inject (docs/synth.md). Engine-side ones change what the engine computes
// (and so every later layer); cache-side ones leave the computation right and the cache wrong.
enum class FaultKind {
    None,
    // engine-side
    RopeOffset,      // K of decode positions rotated for position + 1, one layer
    DeadHead,        // one KV head zeroed from a position on, one layer
    WindowOffByOne,  // sliding layers attend to one position too few
    RopePrefill,     // Q and K of a span of prefill positions rotated for position + 3, one layer
    ChunkedPrefill,  // positions restart at 0 at a chunk boundary, every layer
    RopeScaling,     // positions divided by 2 (a linear RoPE scaling the model lacks), every layer
    RopeConvention,  // interleaved pairs where the model rotates halves, one layer
    PartialRotary,   // only half the dims rotated, one layer
    // cache-side
    StaleBlock,      // a block table entry points at another sequence's block
    ShardSwap,       // two TP ranks' shards exchanged, one layer
    Fp8Scale,        // fp8 cache whose stored scale is twice the true one, one layer
    RankVScale,      // V of one TP rank's heads 1.25x, every layer
    GlobalVScale,    // V of every head 0.8x, every layer
    HeadSwap,        // two heads exchanged, one layer
    KvSwap,          // K stored where V belongs and V where K, one layer
    BlockShift,      // the block table one logical block behind from a point on, one group
    LostWrite,       // one decode position never written (zeros), every layer
    BatchMixup,      // from a decode position on, another sequence's KV, every layer
    PrefixReuse,     // a prefix-cache block holding another prefix's KV, one group's layers
    HeadKScale,      // K of one head stored 0.5x, one layer
    LaggingWrite,    // from a decode position on, each position holds the one before it, one layer
    RankUnwritten,   // one TP rank's heads never written (zeros), one layer
    KNegated,        // K of every head stored negated, one layer
    // KV that belongs elsewhere, and windows that do not match the layer's type
    OtherLayer,      // one layer's cache holds the layer before's KV (layer sharing, an index off by one)
    OtherPrompt,     // prompt_1's first block, every layer, holds prompt_0's (a prefix-cache key collision)
    WindowShort,     // sliding layers' caches keep one position fewer than the window: the oldest zeroed
    WindowOnFull,    // full layers' caches keep only the last `window` positions: older ones zeroed
    // a block's bytes read in another order than written, one layer
    LayoutTokenMajor,  // each TP rank's block written head-major, read token-major (2+ heads a rank)
    LayoutKvHalves,    // each TP rank's block written K then V (split halves), read as K and V interleaved per row
    LayoutBlocksFirst, // the layer's cache written K/V-first ([2, num_blocks, ...]) and read blocks-first
                       // ([num_blocks, 2, ...]) on every TP rank: each page holds another block's (unquantised caches)
    // GQA replicas holding the wrong head (fewer KV heads than TP ranks; no DCP), one layer
    ReplicaWrongHead,  // a replica rank (default: the last) holds the next head's KV, its read copy the right one
    ReadRankWrongHead, // a rank the analysis reads (default: the second head's) holds the next head's KV, its
                       // replicas the right one
    // damage that follows the engine's structure, one layer
    LastBlockFill,   // K and V of every head 0.5x at the first 3 decode positions of the prompts whose
                     // last block is at most half full (prompt_len mod block size <= half of it)
    ChunkBoundary,   // K and V of every head 0.75x from the start of prefill chunk 1 to the prompt's
                     // end (chunks recorded in the provenance; default: two, the first half the shortest prompt)
    // magnitude with the direction intact (not in allFaultKinds: magnitudeFaultKinds)
    TokenScale,      // K of every head scaled by a factor per position (0.4-1.6x), one layer
    ChannelScale,    // V of one head scaled by a factor per channel (0.5-1.5x), one layer
    QkvBias,         // K (before RoPE) and V of one head plus a constant bias, one layer
    Clipped,         // K of every head clipped at +-1.5 (a cast without a scale), one layer
    ReplicaDiff,     // one TP rank's copy of one block differs from the other replicas (MLA, or
                     // replicated heads), one layer; a capture-level finding, not a suspect
    // quantised caches (fp8 e4m3 unless --kv-dtype says otherwise)
    ScaleGranularity,  // quantised with one scale per tensor, recorded per head, one layer
    ScaleOtherLayer,   // quantised with another layer's scale, recorded with its own, one layer
    // non-finite values: one value of K of one head at one decode position, one layer
    Nan,          // NaN in the engine's cache
    Inf,          // +infinity in the engine's cache
    NanExpected,  // NaN in the reference (expected), the engine right
    // a hybrid model's recurrent state (--hybrid), one Mamba2 layer at one checkpoint, the engine
    // running on from the wrong state (not in allFaultKinds: stateFaultKinds)
    StateStale,         // the state of the checkpoint before, prompt_0
    StateOtherRequest,  // prompt_0's state at the same checkpoint, in prompt_1
    StateNotReset,      // the state plus 0.5 x prompt_0's final state (a slot not reset), in prompt_1
    StateZeros,         // zeros, prompt_0
    StateScale,         // the state 0.5x, prompt_0
};

std::string faultName(FaultKind kind);                 // "none", "rope_offset", ...
bool parseFault(const std::string& name, FaultKind& kind);
// nan, inf, nan_expected: a NaN or infinity, which a suspect names without a hypothesis.
inline bool isNonFiniteFault(FaultKind kind)
{
    return kind == FaultKind::Nan || kind == FaultKind::Inf || kind == FaultKind::NanExpected;
}
// The llama3 scaling of ModelShape::llama3Rope, as the bundle's `rope` attribute records it.
RopeScaling llama3Scaling();

// Every kind a suspect should explain, in declaration order (None, ReplicaDiff and the
// non-finite kinds aside: those are named without a hypothesis to test, and tested apart).
std::vector<FaultKind> allFaultKinds();
// The magnitude kinds (token_scale, channel_scale, qkv_bias, clipped), tested apart from the
// scored catalogue (tst_suspects).
std::vector<FaultKind> magnitudeFaultKinds();
// The recurrent-state kinds (state_stale, state_other_request, state_not_reset, state_zeros,
// state_scale): they need a hybrid model (ModelCaptureOptions::hybrid).
std::vector<FaultKind> stateFaultKinds();
bool isStateFault(FaultKind kind);

// A Mamba2 mixer's shape (Dao & Gu 2024; HF Mamba2Config's names in brackets).
struct Mamba2Shape {
    int heads = 8;       // num_heads; the inner width (intermediate_size) is heads x headDim
    int headDim = 16;    // head_dim
    int stateSize = 16;  // state_size (d_state)
    int groups = 2;      // n_groups: consecutive heads share B and C, heads / groups a group
    int convWidth = 4;   // conv_kernel (d_conv)
    // The engine keeps the SSM state in bf16 (vLLM's mamba_ssm_cache_dtype "bfloat16"), not fp32.
    bool engineStateBf16 = false;
    int inner() const { return heads * headDim; }
    int convDim() const { return inner() + 2 * groups * stateSize; }  // x | B | C
};

struct ModelShape {
    int layers = 4;
    int hidden = 64;
    int queryHeads = 4;
    int kvHeads = 2;
    int headDim = 16;
    int ffn = 128;
    int vocab = 256;
    int window = 16;  // sliding window of the even layers, counting the query token
    // The even layers attend within chunks of `window` tokens (Llama 4's chunked local
    // attention: a position sees its own chunk up to itself) instead of a sliding window.
    bool chunked = false;
    // Layers whose KV head 0 is 2^quietHeadOctaves times smaller than the rest (its query
    // heads and the output projection make up for it exactly, so the model is the same): a
    // head that one scale for the whole tensor crushes, as trained models have.
    std::vector<int> quietHeadLayers;
    int quietHeadOctaves = 12;
    // Multi-head latent attention (DeepSeek's) when kvLoraRank > 0: each token caches one latent,
    // c_kv (kvLoraRank values, RMS-normalised) and k_pe (ropeHeadDim values, rotated), from
    // which every query head gets its own K (headDim values up-projected from c_kv, then k_pe)
    // and V (headDim values). kvHeads is then 1 and every layer attends fully.
    int kvLoraRank = 0;
    int ropeHeadDim = 0;
    bool mla() const { return kvLoraRank > 0; }
    // The RoPE's scaling: none, or Llama 3.1's (llama3Scaling(): factor 8, low / high frequency
    // factors 1 and 4 over an original context of 32 positions, so that a short capture has
    // pairs in all three bands and runs past the original context).
    bool llama3Rope = false;
    // A hybrid model: these layers are Mamba2 mixers (mamba2_mixer.h) instead of attention, each
    // keeping its state at every multiple of mambaCheckpointEvery positions (0: none).
    std::vector<int> mambaLayers;
    Mamba2Shape mamba;
    int mambaCheckpointEvery = 0;
    bool isMamba(int layer) const
    {
        for (int l : mambaLayers)
            if (l == layer)
                return true;
        return false;
    }
};

struct ModelCaptureOptions {
    ModelShape shape;
    bool slidingWindowSpec = true;  // SlidingWindowSpec (blocks freed) or FullAttentionSpec(sliding_window)
    // Layers a hybrid model has as state-space layers: their group is a MambaSpec group, and the
    // capture holds no KV of theirs. Without `hybrid` the model computes them as attention and
    // nothing reads them; with it they are Mamba2 mixers (shape.mamba; default: the even layers,
    // named model.layers.N.mixer), whose recurrent state the capture holds per TP rank as vLLM
    // shards it, with the references', at every multiple of the MambaSpec group's block size
    // (fullBlockSize; vLLM's mamba_cache_mode "all") and at the end of each prompt's run.
    std::vector<int> stateSpaceLayers;
    bool hybrid = false;
    std::uint64_t seed = 1;
    // The engine's cache.
    int tpSize = 2;
    // Decode context parallelism: consecutive groups of dcpSize ranks holding one head split its
    // positions, dealt in runs of cpInterleave (vLLM's cp_kv_cache_interleave_size).
    int dcpSize = 1;
    int cpInterleave = 1;
    int fullBlockSize = 8;
    int slidingBlockSize = 4;
    // The cache's dtype, and for a quantised one how finely it is scaled (scales from the
    // engine's own KV: amax / the format's largest value). The quantised faults make it fp8
    // e4m3 when it is not quantised.
    DType kvDtype = DType::BFloat16;
    ScaleGranularity kvScale = ScaleGranularity::Tensor;
    // The run.
    std::vector<int> promptLens{12, 20};
    int decodeTokens = 10;
    bool baseline = true;  // three-way
    // The engine's side only, without reference KV (an engine-only bundle, for kvscope diff).
    bool engineOnly = false;
    // The fault and where it applies (-1: a sensible default, chosen and recorded).
    FaultKind fault = FaultKind::None;
    int faultLayer = -1;
    int faultHead = -1;
    int faultRank = -1;
    // Where dead_head and stale_block start, as position - prompt_len: negative values lie in
    // the prefill (down to -shortest prompt). kDefaultStep: a third into the decode.
    static constexpr int kDefaultStep = -1000000;
    int faultStep = kDefaultStep;
    std::string model = "kvscope-synth";
    // Where each position's KV came from, recorded on every prompt (synthetic_provenance.h's
    // SPEC); empty: not recorded.
    std::string provenance;
    int threads = 0;  // prompts computed in parallel (0: one per core); the result does not depend on it
    // The impact of the engine's KV on the model's output, measured and recorded (impact_capture.h),
    // with the what-if schemes whose impact per layer is measured too (vLLM's fp8 cache by default).
    bool impact = true;
    std::vector<std::string> impactSchemes{"fp8_e4m3/tensor"};
};

// The demo capture: 24 layers alternating sliding/full attention, 8 KV heads of dim 128
// (16 query heads), TP 4, block size 16, 3 prompts of 100-300 tokens, and a rope_offset fault.
ModelCaptureOptions demoModelCaptureOptions();
// The MLA demo: 16 layers of DeepSeek-style latent attention (8 query heads; c_kv 256 and k_pe 32
// wide), TP 4 (every rank holds the latent), block size 16, the same prompts, and a fault in k_pe
// of layer 9 (decode positions rotated for position + 1).
ModelCaptureOptions demoMlaCaptureOptions();
// The hybrid demo: the demo's 24 layers with the even ones Mamba2 mixers (16 heads of 16, d_state
// 32, 4 groups) and the odd ones full attention, TP 4, and a state_stale fault in layer 12.
ModelCaptureOptions demoHybridCaptureOptions();
// `o` turned into an MLA model of the same size: one latent per token, kvLoraRank 4 x headDim and
// ropeHeadDim headDim / 2 (even), every layer full attention.
ModelCaptureOptions withMla(ModelCaptureOptions o);

// Runs the model and writes the capture. Deterministic: the same options give identical
// tensors, tables and logits on every CPU and with any number of threads. Throws
// std::invalid_argument on inconsistent options, BundleError on I/O failure.
void writeModelCapture(const std::string& path, const ModelCaptureOptions& options);

}  // namespace kvscope::synth
