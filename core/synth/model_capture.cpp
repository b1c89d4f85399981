#include "synth/model_capture.h"
#include "synth/synthetic_provenance.h"

#include "format/bundle_writer.h"
#include "format/nvfp4.h"
#include "format/provenance.h"
#include "kv/block_layout.h"
#include "kv/paged_layout.h"
#include "synth/impact_capture.h"
#include "synth/state_capture.h"
#include "synth/tiny_transformer.h"
#include "util/deterministic_math.h"
#include "util/json_writer.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <exception>
#include <numeric>
#include <set>
#include <functional>
#include <limits>
#include <map>
#include <random>
#include <stdexcept>
#include <thread>

namespace kvscope::synth {

namespace {

// The synthetic vocabulary's text: a pronounceable word per id (two or three syllables), so
// that the app's axis and tooltips show text as they do for a real tokenizer's strings.
std::string tokenText(std::int64_t id)
{
    static const char consonants[] = "bdfgklmnprstvz";
    static const char vowels[] = "aeiou";
    constexpr std::int64_t syllables = 14 * 5;
    std::string word;
    std::int64_t rest = id;
    do {
        const std::int64_t s = rest % syllables;
        word += consonants[s / 5];
        word += vowels[s % 5];
        rest /= syllables;
    } while (rest > 0 || word.size() < 4);
    return word;
}


// At most this many generate calls per prompt: after that many re-feeds, the last call is
// scored teacher-forced to the end (its later divergences are recorded, not re-fed), which
// keeps captures of badly broken engines from growing one snapshot per token.
constexpr int kMaxSnapshots = 4;

const std::pair<FaultKind, const char*> kFaultNames[] = {
    {FaultKind::None, "none"},
    {FaultKind::RopeOffset, "rope_offset"},
    {FaultKind::DeadHead, "dead_head"},
    {FaultKind::WindowOffByOne, "window_off_by_one"},
    {FaultKind::RopePrefill, "rope_prefill"},
    {FaultKind::ChunkedPrefill, "chunked_prefill"},
    {FaultKind::RopeScaling, "rope_scaling"},
    {FaultKind::RopeConvention, "rope_convention"},
    {FaultKind::PartialRotary, "partial_rotary"},
    {FaultKind::StaleBlock, "stale_block"},
    {FaultKind::ShardSwap, "shard_swap"},
    {FaultKind::Fp8Scale, "fp8_scale"},
    {FaultKind::ScaleGranularity, "scale_granularity"},
    {FaultKind::ScaleOtherLayer, "scale_other_layer"},
    {FaultKind::RankVScale, "rank_v_scale"},
    {FaultKind::GlobalVScale, "global_v_scale"},
    {FaultKind::HeadSwap, "head_swap"},
    {FaultKind::KvSwap, "kv_swap"},
    {FaultKind::BlockShift, "block_shift"},
    {FaultKind::LostWrite, "lost_write"},
    {FaultKind::BatchMixup, "batch_mixup"},
    {FaultKind::PrefixReuse, "prefix_reuse"},
    {FaultKind::HeadKScale, "head_k_scale"},
    {FaultKind::LaggingWrite, "lagging_write"},
    {FaultKind::RankUnwritten, "rank_unwritten"},
    {FaultKind::KNegated, "k_negated"},
    {FaultKind::OtherLayer, "other_layer"},
    {FaultKind::OtherPrompt, "other_prompt"},
    {FaultKind::WindowShort, "window_short"},
    {FaultKind::WindowOnFull, "window_on_full_layers"},
    {FaultKind::LayoutTokenMajor, "layout_token_major"},
    {FaultKind::LayoutKvHalves, "layout_kv_halves"},
    {FaultKind::LayoutBlocksFirst, "layout_blocks_first"},
    {FaultKind::ReplicaWrongHead, "replica_wrong_head"},
    {FaultKind::ReadRankWrongHead, "read_rank_wrong_head"},
    {FaultKind::LastBlockFill, "last_block_fill"},
    {FaultKind::ChunkBoundary, "chunk_boundary"},
    {FaultKind::TokenScale, "token_scale"},
    {FaultKind::ChannelScale, "channel_scale"},
    {FaultKind::QkvBias, "qkv_bias"},
    {FaultKind::Clipped, "clipped"},
    {FaultKind::ReplicaDiff, "replica_diff"},
    {FaultKind::Nan, "nan"},
    {FaultKind::Inf, "inf"},
    {FaultKind::NanExpected, "nan_expected"},
    {FaultKind::StateStale, "state_stale"},
    {FaultKind::StateOtherRequest, "state_other_request"},
    {FaultKind::StateNotReset, "state_not_reset"},
    {FaultKind::StateZeros, "state_zeros"},
    {FaultKind::StateScale, "state_scale"},
};

std::string layerName(int i)
{
    return "model.layers." + std::to_string(i) + ".self_attn";
}

// What the engine's cache holds per token: kvHeads heads of K and V, or MLA's one latent.
int cacheHeads(const ModelShape& shape)
{
    return shape.mla() ? 1 : shape.kvHeads;
}
HeadDims cacheDims(const ModelShape& shape)
{
    return shape.mla() ? HeadDims(shape.kvLoraRank, shape.ropeHeadDim) : HeadDims(shape.headDim);
}

LayerKv toLayerKv(const LayerCache& c, const ModelShape& shape, std::int64_t positions)
{
    if (c.k.empty())  // a Mamba2 layer: no KV
        return LayerKv::unwritten(cacheHeads(shape), 0, cacheDims(shape));
    LayerKv kv = LayerKv::unwritten(cacheHeads(shape), positions, cacheDims(shape));
    std::copy_n(c.k.begin(), kv.k.size(), kv.k.begin());
    std::copy_n(c.v.begin(), kv.v.size(), kv.v.begin());
    std::fill(kv.present.begin(), kv.present.end(), 1);
    return kv;
}

// Positions [from, end) of `part` of a position-major cache as HF's [1, heads, t, dim].
RawTensor referenceTensor(const std::vector<float>& x, const ModelShape& shape, KvPart part, std::int64_t from,
                          std::int64_t end, DType dtype)
{
    const std::int64_t t = end - from, dim = cacheDims(shape).of(part), heads = cacheHeads(shape);
    std::vector<float> values(std::size_t(heads * t * dim));
    for (int h = 0; h < heads; ++h)
        for (std::int64_t p = 0; p < t; ++p)
            std::copy_n(x.begin() + std::ptrdiff_t(((from + p) * heads + h) * dim), dim,
                        values.begin() + std::ptrdiff_t((h * t + p) * dim));
    return RawTensor::fromFloat(dtype, {1, heads, t, dim}, values);
}

Logits stepLogits(const Matrix& logits, std::int64_t firstRow, std::int64_t steps)
{
    Logits out;
    out.steps = steps;
    out.vocab = logits.cols;
    out.values.assign(logits.row(int(firstRow)), logits.row(int(firstRow + steps)));
    return out;
}

// The first largest logit, as torch.argmax.
std::int64_t argmaxRow(const Matrix& logits, std::int64_t row)
{
    const float* r = logits.row(int(row));
    return std::max_element(r, r + logits.cols) - r;
}

// The head a head_swap exchanges with: its neighbour in the same pair.
int swapPartner(int head, int heads)
{
    return (head ^ 1) < heads ? head ^ 1 : head - 1;
}

// What a non-finite fault writes.
float nonFiniteValue(FaultKind kind)
{
    return kind == FaultKind::Inf ? std::numeric_limits<float>::infinity() : std::numeric_limits<float>::quiet_NaN();
}

// The magnitude faults' values: a factor per position (0.4-1.6x) and per channel (0.5-1.5x),
// spread evenly by the golden ratio; a bias of about 0.5 per value (K's values are about 1);
// the clip bound.
constexpr double kGolden = 0.6180339887498949;
float tokenFactor(std::int64_t position)
{
    const double x = double(position) * kGolden;
    return float(0.4 + 1.2 * (x - std::floor(x)));
}
float channelFactor(int channel)
{
    const double x = double(channel) * kGolden + 0.3;
    return float(0.5 + (x - std::floor(x)));
}
float biasValue(int channel, bool v)
{
    return float(0.5 * std::cos(1.7 * channel + (v ? 1.1 : 0.3)) * std::sqrt(2.0));
}
constexpr float kClipBound = 1.5f;

// The structural faults: last_block_fill halves the first kLastBlockFillTokens decode positions
// of the prompts whose last block is at most half full; chunk_boundary writes prefill chunk 1 on
// at 0.75x (a scale kept from the first chunk).
constexpr int kLastBlockFillTokens = 3;
constexpr float kLastBlockFillFactor = 0.5f;
constexpr float kChunkBoundaryFactor = 0.75f;

// Whether last_block_fill damages a prompt of `promptLen` in blocks of `blockSize`.
bool lastBlockAtMostHalfFull(std::int64_t promptLen, std::int64_t blockSize)
{
    return promptLen % blockSize <= blockSize / 2;
}

// The provenance SPEC recorded on every prompt: the options', or for chunk_boundary without one
// two prefill chunks, the first half the shortest prompt long.
std::string provenanceSpecOf(const ModelCaptureOptions& o)
{
    if (!o.provenance.empty() || o.fault != FaultKind::ChunkBoundary || o.promptLens.empty())
        return o.provenance;
    const int shortest = *std::min_element(o.promptLens.begin(), o.promptLens.end());
    return "prefill:" + std::to_string(std::max(1, shortest / 2)) + ",prefill";
}

// Where prefill chunk 1 starts in a prompt of `promptLen` (-1: the provenance records none).
std::int64_t chunkOneStart(const ModelCaptureOptions& o, std::int64_t promptLen)
{
    const std::string spec = provenanceSpecOf(o);
    if (spec.empty())
        return -1;
    const std::int64_t total = promptLen + o.decodeTokens;
    for (const ProvenanceRange& r : parseProvenance(provenanceFromSpec(spec, promptLen, o.decodeTokens), total))
        if (r.kind == ProvenanceKind::Prefill && r.chunk == 1)
            return r.start;
    return -1;
}

// The block size of the fault layer's group (MLA: one full group).
int faultBlockSize(const ModelCaptureOptions& o, int layer)
{
    return !o.shape.mla() && layer % 2 == 0 ? o.slidingBlockSize : o.fullBlockSize;
}

struct ResolvedFault {
    FaultKind kind = FaultKind::None;
    int layer = -1;
    int head = -1;
    int rank = -1;
    int step = -1;
    nlohmann::json truth;
};

// The ground truth of the faults the forward pass makes (RoPE, windows, a dead head).
bool forwardFaultTruth(const ResolvedFault& f, const ModelCaptureOptions& o, nlohmann::json& truth)
{
    switch (f.kind) {
    case FaultKind::RopeOffset:
        truth["layer"] = layerName(f.layer);
        truth["from_position"] = "prompt_len";
        truth["description"] = std::string(o.shape.mla() ? "k_pe" : "K") + " of decode positions rotated for position + 1";
        return true;
    case FaultKind::DeadHead:
        truth["layer"] = layerName(f.layer);
        truth["head"] = f.head;
        truth["from_decode_step"] = f.step;
        return true;
    case FaultKind::WindowOffByOne:
        truth["layers"] = "every sliding-window layer";
        truth["description"] = "the engine attends to window - 1 positions";
        return true;
    case FaultKind::RopePrefill:
        truth["layer"] = layerName(f.layer);
        truth["description"] = "Q and K of prefill positions [len/8, 5 len/8) rotated for position + 3";
        return true;
    case FaultKind::ChunkedPrefill:
        truth["layers"] = "every layer";
        truth["description"] = "positions restart at 0 at the prompt's middle (rounded down to 4)";
        return true;
    case FaultKind::RopeScaling:
        truth["layers"] = "every layer";
        truth["description"] = "RoPE positions divided by 2";
        return true;
    case FaultKind::RopeConvention:
        truth["layer"] = layerName(f.layer);
        truth["description"] = "interleaved pairs where the model rotates halves";
        return true;
    case FaultKind::PartialRotary:
        truth["layer"] = layerName(f.layer);
        truth["description"] = "only the first half of each head's dims rotated";
        return true;
    case FaultKind::QkvBias: {
        if (o.shape.mla())
            throw std::invalid_argument("qkv_bias needs K and V heads (not --mla)");
        truth["layer"] = layerName(f.layer);
        truth["head"] = f.head;
        double k = 0, v = 0;
        for (int d = 0; d < o.shape.headDim; ++d)
            k += double(biasValue(d, false)) * biasValue(d, false), v += double(biasValue(d, true)) * biasValue(d, true);
        truth["k_norm"] = std::sqrt(k);
        truth["v_norm"] = std::sqrt(v);
        truth["description"] = "K (before RoPE) and V of one head plus a constant bias";
        return true;
    }
    default:
        return false;
    }
}

// The ground truth of the faults in a quantised cache's scales.
bool scaleFaultTruth(const ResolvedFault& f, const ModelCaptureOptions& o, nlohmann::json& truth)
{
    switch (f.kind) {
    case FaultKind::Fp8Scale:
        truth["layer"] = layerName(f.layer);
        truth["description"] = "stored dequantisation scale twice the true one";
        return true;
    case FaultKind::ScaleGranularity:
        truth["layer"] = layerName(f.layer);
        truth["description"] = "quantised with one scale for the whole tensor, recorded as per-head scales";
        return true;
    case FaultKind::ScaleOtherLayer:
        truth["layer"] = layerName(f.layer);
        truth["description"] = "quantised with another layer's scale, recorded with its own";
        return true;
    case FaultKind::RankVScale:
        if (f.rank >= o.tpSize)
            throw std::invalid_argument("rank_v_scale needs rank " + std::to_string(f.rank) + " under tp_size " +
                                        std::to_string(o.tpSize));
        truth["layers"] = "every layer";
        truth["rank"] = f.rank;
        truth["factor"] = 1.25;
        if (o.dcpSize > 1)
            truth["dcp_rank"] = f.rank % o.dcpSize;
        return true;
    case FaultKind::GlobalVScale:
        truth["layers"] = "every layer";
        truth["factor"] = 0.8;
        return true;
    case FaultKind::HeadKScale:
        truth["layer"] = layerName(f.layer);
        truth["head"] = f.head;
        truth["factor"] = 0.5;
        return true;
    case FaultKind::TokenScale:
        truth["layer"] = layerName(f.layer);
        truth["description"] = "K of every head scaled by a factor per position, 0.4-1.6x";
        return true;
    case FaultKind::ChannelScale:
        truth["layer"] = layerName(f.layer);
        truth["head"] = f.head;
        truth["description"] = "V of one head scaled by a factor per channel, 0.5-1.5x, the same at every position";
        return true;
    case FaultKind::Clipped:
        truth["layer"] = layerName(f.layer);
        truth["bound"] = kClipBound;
        truth["description"] = "K of every head clipped at +-bound";
        return true;
    default:
        return false;
    }
}

// The ground truth of the faults in the cache's contents and tables.
bool cacheFaultTruth(const ResolvedFault& f, const ModelCaptureOptions& o, nlohmann::json& truth)
{
    switch (f.kind) {
    case FaultKind::ShardSwap:
        if (f.rank + 1 >= o.tpSize)
            throw std::invalid_argument("shard_swap needs ranks " + std::to_string(f.rank) + " and " +
                                        std::to_string(f.rank + 1) + " under tp_size " + std::to_string(o.tpSize));
        truth["layer"] = layerName(f.layer);
        truth["ranks"] = {f.rank, f.rank + 1};
        return true;
    case FaultKind::StaleBlock:
        truth["layer_group_of"] = layerName(f.layer);
        truth["from_decode_step"] = f.step;
        return true;
    case FaultKind::HeadSwap:
        truth["layer"] = layerName(f.layer);
        truth["heads"] = {f.head, swapPartner(f.head, o.shape.kvHeads)};
        return true;
    case FaultKind::KvSwap:
        truth["layer"] = layerName(f.layer);
        return true;
    case FaultKind::BlockShift:
        truth["layer_group_of"] = layerName(f.layer);
        truth["from_decode_step"] = f.step;
        truth["description"] = "table entries from the block of the fault position on point one logical block earlier";
        return true;
    case FaultKind::LostWrite:
        truth["layers"] = "every layer";
        truth["decode_step"] = f.step;
        return true;
    case FaultKind::BatchMixup:
        truth["layers"] = "every layer";
        truth["from_decode_step"] = f.step;
        truth["prompt"] = "prompt_0";
        return true;
    case FaultKind::PrefixReuse:
        truth["layer_group_of"] = layerName(f.layer);
        truth["at_step"] = f.step;
        truth["prompt"] = "prompt_0";
        return true;
    case FaultKind::LaggingWrite:
        truth["layer"] = layerName(f.layer);
        truth["from_decode_step"] = f.step;
        truth["description"] = "position t holds position t - 1's K and V";
        return true;
    case FaultKind::RankUnwritten:
        if (f.rank >= o.tpSize)
            throw std::invalid_argument("rank_unwritten needs rank " + std::to_string(f.rank) + " under tp_size " +
                                        std::to_string(o.tpSize));
        truth["layer"] = layerName(f.layer);
        truth["rank"] = f.rank;
        if (o.dcpSize > 1)
            truth["dcp_rank"] = f.rank % o.dcpSize;
        return true;
    case FaultKind::KNegated:
        truth["layer"] = layerName(f.layer);
        return true;
    case FaultKind::OtherLayer:
        if (f.layer < 1)
            throw std::invalid_argument("other_layer needs a layer before the fault layer (not layer 0)");
        truth["layer"] = layerName(f.layer);
        truth["holds"] = layerName(f.layer - 1);
        truth["description"] = "the layer's cache holds the layer before's K and V (layer sharing, an index off by one)";
        return true;
    case FaultKind::OtherPrompt:
        truth["prompt"] = "prompt_1";
        truth["holds_prompt"] = "prompt_0";
        truth["layers"] = "every layer";
        truth["description"] = "the first block (of each group's block size) holds prompt_0's first block: a prefix-cache key collision";
        return true;
    case FaultKind::WindowShort:
        truth["layers"] = "every sliding-window layer";
        truth["description"] = "the cache keeps one position fewer than the window: the oldest position the window holds is zero";
        return true;
    case FaultKind::WindowOnFull:
        truth["layers"] = "every full-attention layer";
        truth["window"] = o.shape.window;
        truth["description"] = "the cache keeps only the last `window` positions (the model's sliding window applied to its full layers): older ones zero";
        return true;
    case FaultKind::LayoutTokenMajor:
        if (o.shape.kvHeads < 2 * o.tpSize)
            throw std::invalid_argument("layout_token_major needs at least two KV heads a TP rank (" +
                                        std::to_string(o.shape.kvHeads) + " heads, tp_size " + std::to_string(o.tpSize) + ")");
        truth["layer"] = layerName(f.layer);
        truth["written_as"] = "head_major";
        truth["read_as"] = "token_major";
        truth["description"] = "each TP rank's block written [heads, rows] and read [rows, heads]";
        return true;
    case FaultKind::LayoutKvHalves:
        truth["layer"] = layerName(f.layer);
        truth["written_as"] = "kv_split";
        truth["read_as"] = "kv_interleaved_rows";
        truth["description"] = "each TP rank's block written all K then all V, read as K and V alternating row by row";
        return true;
    case FaultKind::LayoutBlocksFirst:
        truth["layer"] = layerName(f.layer);
        truth["written_as"] = "kv_first";
        truth["read_as"] = "blocks_first";
        truth["description"] = "every TP rank's cache of the layer written [2, num_blocks, ...] (all K pages, then all V) "
                               "and read [num_blocks, 2, ...] (each block's K page, then its V)";
        return true;
    case FaultKind::ReplicaWrongHead:
    case FaultKind::ReadRankWrongHead: {
        const int copies = o.tpSize / std::max(1, o.shape.kvHeads);  // ranks holding one head
        const bool read = f.kind == FaultKind::ReadRankWrongHead;
        if (o.shape.mla() || o.shape.kvHeads < 2 || o.shape.kvHeads >= o.tpSize || o.dcpSize > 1)
            throw std::invalid_argument(faultName(f.kind) + " needs at least two KV heads replicated over the TP ranks "
                                        "(fewer KV heads than ranks, no DCP): " + std::to_string(o.shape.kvHeads) +
                                        " heads, tp_size " + std::to_string(o.tpSize));
        if (f.rank < 0 || f.rank >= o.tpSize || (f.rank % copies == 0) != read)
            throw std::invalid_argument(faultName(f.kind) + " needs " + (read ? "a rank the analysis reads (0, " : "a replica rank (not 0, ") +
                                        std::to_string(copies) + ", ...): rank " + std::to_string(f.rank) + " of tp_size " +
                                        std::to_string(o.tpSize));
        const int head = f.rank / copies, other = (head + 1) % o.shape.kvHeads;
        truth["layer"] = layerName(f.layer);
        truth["rank"] = f.rank;
        truth["holds_head"] = other;
        truth["should_hold_head"] = head;
        truth["holds_rank"] = other * copies;               // whose copy it holds
        truth["replica_rank"] = read ? f.rank + 1 : head * copies;  // a copy of the right head
        truth["read"] = read;
        truth["description"] = std::string(read ? "a rank the analysis reads" : "a replica rank") + " holds the next head's KV "
                               "(that head's read copy), every snapshot";
        return true;
    }
    case FaultKind::LastBlockFill: {
        const int bs = faultBlockSize(o, f.layer);
        nlohmann::json damaged = nlohmann::json::array(), spared = nlohmann::json::array();
        std::string fills;
        for (std::size_t p = 0; p < o.promptLens.size(); ++p) {
            (lastBlockAtMostHalfFull(o.promptLens[p], bs) ? damaged : spared).push_back("prompt_" + std::to_string(p));
            fills += (p ? ", " : "") + std::to_string(o.promptLens[p] % bs);
        }
        if (damaged.empty() || spared.empty())
            throw std::invalid_argument("last_block_fill needs prompts whose last block is at most half full and prompts "
                                        "whose last block is fuller (prompt_len mod " + std::to_string(bs) + " <= " +
                                        std::to_string(bs / 2) + " and > " + std::to_string(bs / 2) + ", the block size of layer " +
                                        std::to_string(f.layer) + "); --prompts gives mod " + std::to_string(bs) + " = " + fills);
        truth["layer"] = layerName(f.layer);
        truth["block_size"] = bs;
        truth["decode_positions"] = std::min(kLastBlockFillTokens, o.decodeTokens);
        truth["factor"] = kLastBlockFillFactor;
        truth["damaged_prompts"] = damaged;
        truth["spared_prompts"] = spared;
        truth["description"] = "K and V of every head 0.5x at the first decode positions of the prompts whose last block "
                               "is at most half full (prompt_len mod block_size <= block_size / 2)";
        return true;
    }
    case FaultKind::ChunkBoundary: {
        nlohmann::json starts = nlohmann::json::object();
        for (std::size_t p = 0; p < o.promptLens.size(); ++p) {
            const std::int64_t start = chunkOneStart(o, o.promptLens[p]);
            if (start < 1 || start >= o.promptLens[p])
                throw std::invalid_argument("chunk_boundary needs a prefill chunk 1 inside every prompt (--provenance " +
                                            provenanceSpecOf(o) + ", prompt_" + std::to_string(p) + " of " +
                                            std::to_string(o.promptLens[p]) + " tokens)");
            starts["prompt_" + std::to_string(p)] = start;
        }
        truth["layer"] = layerName(f.layer);
        truth["chunk"] = 1;
        truth["chunk_start"] = starts;
        truth["factor"] = kChunkBoundaryFactor;
        truth["description"] = "K and V of every head 0.75x from the start of prefill chunk 1 to the prompt's end";
        return true;
    }
    case FaultKind::Nan: case FaultKind::Inf: case FaultKind::NanExpected:
        truth["layer"] = layerName(f.layer);
        truth["head"] = f.head;
        truth["part"] = "k";
        truth["decode_step"] = f.step;
        truth["side"] = f.kind == FaultKind::NanExpected ? "expected" : "actual";
        truth["value"] = f.kind == FaultKind::Inf ? "inf" : "nan";
        return true;
    case FaultKind::ReplicaDiff:
        // The ranks whose copy the analysis reads: the first DCP group of each head's ranks.
        if (f.rank < 1 || f.rank >= o.tpSize ||
            f.rank % (o.shape.mla() ? o.tpSize : o.tpSize / std::min(o.tpSize, o.shape.kvHeads)) < o.dcpSize)
            throw std::invalid_argument("replica_diff needs a rank that holds a replica, not the copy the analysis "
                                        "reads (rank " + std::to_string(f.rank) + " of tp_size " +
                                        std::to_string(o.tpSize) + ", dcp_size " + std::to_string(o.dcpSize) + ")");
        truth["layer"] = layerName(f.layer);
        truth["rank"] = f.rank;
        truth["from_decode_step"] = f.step;
        truth["description"] = "the lowest bit of every value of one block of this rank's copy flipped";
        return true;
    default:
        return false;
    }
}

ResolvedFault resolveFault(const ModelCaptureOptions& o)
{
    ResolvedFault f;
    f.kind = o.fault;
    if (f.kind == FaultKind::None) {
        f.truth = {{"kind", "none"}};
        return f;
    }
    // Defaults: a full-attention layer in the middle, the middle head, ranks 0 and 1, a third
    // into the decode.
    f.layer = o.faultLayer >= 0 ? o.faultLayer : std::min((o.shape.layers / 2) | 1, o.shape.layers - 1);
    f.head = o.faultHead >= 0 ? o.faultHead : o.shape.kvHeads / 2;
    f.rank = o.faultRank >= 0                              ? o.faultRank
             : o.fault == FaultKind::ReplicaDiff             ? 1
             : o.fault == FaultKind::ReplicaWrongHead        ? o.tpSize - 1
             : o.fault == FaultKind::ReadRankWrongHead       ? o.tpSize / std::max(1, o.shape.kvHeads)
                                                             : 0;
    f.step = o.faultStep != ModelCaptureOptions::kDefaultStep ? o.faultStep : o.decodeTokens / 3;
    if (std::find(o.stateSpaceLayers.begin(), o.stateSpaceLayers.end(), f.layer) != o.stateSpaceLayers.end() &&
        o.fault != FaultKind::None)
        throw std::invalid_argument("the fault's layer " + std::to_string(f.layer) +
                                    " is a state-space layer, which the capture does not hold");
    if (f.layer < 0 || f.layer >= o.shape.layers)
        throw std::invalid_argument("fault layer " + std::to_string(f.layer) + " outside the model");
    if (f.head >= o.shape.kvHeads)
        throw std::invalid_argument("fault head " + std::to_string(f.head) + " outside the KV heads");
    if (f.step >= o.decodeTokens)
        throw std::invalid_argument("fault step " + std::to_string(f.step) + " beyond the decode");
    if (f.step < -*std::min_element(o.promptLens.begin(), o.promptLens.end()))
        throw std::invalid_argument("fault step " + std::to_string(f.step) + " before the start of the shortest prompt");
    f.truth = {{"kind", faultName(f.kind)}};
    if (!forwardFaultTruth(f, o, f.truth) && !scaleFaultTruth(f, o, f.truth))
        cacheFaultTruth(f, o, f.truth);
    return f;
}

// An MLA model's one group, as vLLM reports it: num_kv_heads 1, head_size = kv_lora_rank +
// qk_rope_head_dim; total_num_kv_heads is the model config's (the query heads, as DeepSeek's
// num_key_value_heads), which an MLA cache does not split.
KvCacheConfig makeMlaConfig(const ModelCaptureOptions& o, std::int64_t longest, DType kvDtype)
{
    nlohmann::json layers = nlohmann::json::array();
    for (int l = 0; l < o.shape.layers; ++l)
        layers.push_back(layerName(l));
    const std::int64_t blocks = (longest / o.fullBlockSize + 2) * 3 / 2 + 4;
    nlohmann::json group = {{"layer_names", layers}, {"spec_type", "MLAAttentionSpec"}, {"block_size", o.fullBlockSize},
                            {"sliding_window", nullptr}, {"dtype", "torch." + dtypeName(kvDtype)}, {"num_kv_heads", 1},
                            {"head_size", o.shape.kvLoraRank + o.shape.ropeHeadDim},
                            {"kv_lora_rank", o.shape.kvLoraRank}, {"qk_rope_head_dim", o.shape.ropeHeadDim}};
    nlohmann::json cfg = {{"num_blocks", blocks}, {"tp_size", o.tpSize}, {"total_num_kv_heads", o.shape.queryHeads},
                          {"dcp_size", o.dcpSize}, {"cp_kv_cache_interleave_size", o.cpInterleave}, {"pcp_size", 1},
                          {"groups", {group}}};
    return KvCacheConfig::fromJson(jsonText(cfg), {}, "synthetic config");
}

KvCacheConfig makeConfig(const ModelCaptureOptions& o, std::int64_t longest, DType kvDtype)
{
    if (o.shape.mla())
        return makeMlaConfig(o, longest, kvDtype);
    nlohmann::json sliding = nlohmann::json::array(), full = nlohmann::json::array(), stateSpace = nlohmann::json::array();
    for (int l = 0; l < o.shape.layers; ++l) {
        const bool ssm = std::find(o.stateSpaceLayers.begin(), o.stateSpaceLayers.end(), l) != o.stateSpaceLayers.end();
        (ssm ? stateSpace : l % 2 == 0 ? sliding : full).push_back(ssm && o.hybrid ? mixerLayerName(l) : layerName(l));
    }
    const std::string dtype = configDTypeName(kvDtype);
    const int perRank = std::max(1, o.shape.kvHeads / o.tpSize);
    nlohmann::json groups = nlohmann::json::array();
    std::int64_t blocks = 2;
    if (!sliding.empty() && o.shape.chunked) {
        groups.push_back({{"layer_names", sliding}, {"spec_type", "ChunkedLocalAttentionSpec"},
                          {"block_size", o.slidingBlockSize}, {"sliding_window", nullptr}, {"dtype", dtype},
                          {"num_kv_heads", perRank}, {"head_size", o.shape.headDim},
                          {"attention_chunk_size", o.shape.window}});
        blocks += longest / o.slidingBlockSize + 2;
    } else if (!sliding.empty()) {
        groups.push_back({{"layer_names", sliding},
                          {"spec_type", o.slidingWindowSpec ? "SlidingWindowSpec" : "FullAttentionSpec"},
                          {"block_size", o.slidingBlockSize}, {"sliding_window", o.shape.window}, {"dtype", dtype},
                          {"num_kv_heads", perRank}, {"head_size", o.shape.headDim}, {"attention_chunk_size", nullptr}});
        blocks += longest / o.slidingBlockSize + 2;
    }
    if (!full.empty()) {
        groups.push_back({{"layer_names", full}, {"spec_type", "FullAttentionSpec"}, {"block_size", o.fullBlockSize},
                          {"sliding_window", nullptr}, {"dtype", dtype}, {"num_kv_heads", perRank},
                          {"head_size", o.shape.headDim}, {"attention_chunk_size", nullptr}});
        blocks += longest / o.fullBlockSize + 2;
    }
    if (!stateSpace.empty())  // as vLLM reports a Mamba group: no heads, no head size
        groups.push_back({{"layer_names", stateSpace}, {"spec_type", "MambaSpec"}, {"block_size", o.fullBlockSize}});
    // Slack: freed sliding-window blocks and other sequences' blocks.
    blocks += blocks / 2 + 4;
    nlohmann::json cfg = {{"num_blocks", blocks}, {"tp_size", o.tpSize}, {"total_num_kv_heads", o.shape.kvHeads},
                          {"dcp_size", o.dcpSize}, {"cp_kv_cache_interleave_size", o.cpInterleave}, {"pcp_size", 1},
                          {"groups", groups}};
    return KvCacheConfig::fromJson(jsonText(cfg), {}, "synthetic config");
}

// The faults that mean something for an MLA cache, whose one latent (c_kv, k_pe) per token
// every TP rank holds whole (under DCP, a rank holds its DCP rank's share of the positions).
bool mlaFaultSupported(FaultKind kind, int dcpSize)
{
    switch (kind) {
    case FaultKind::RankVScale: case FaultKind::RankUnwritten:
        return dcpSize > 1;
    case FaultKind::DeadHead: case FaultKind::WindowOffByOne: case FaultKind::WindowShort: case FaultKind::ShardSwap: case FaultKind::Fp8Scale:
    case FaultKind::ScaleGranularity: case FaultKind::ScaleOtherLayer:
    case FaultKind::HeadSwap: case FaultKind::KvSwap:
    case FaultKind::LayoutTokenMajor: case FaultKind::LayoutKvHalves: case FaultKind::LayoutBlocksFirst:
    case FaultKind::ReplicaWrongHead: case FaultKind::ReadRankWrongHead:
    case FaultKind::Nan: case FaultKind::Inf: case FaultKind::NanExpected:
        return false;
    default:
        return true;
    }
}

void checkOptions(const ModelCaptureOptions& o)
{
    auto require = [](bool ok, const std::string& what) {
        if (!ok)
            throw std::invalid_argument(what);
    };
    require(o.shape.layers >= 1 && o.shape.layers <= 512, "layers must be in 1..512");
    require(o.shape.kvHeads >= 1 && o.shape.queryHeads >= o.shape.kvHeads && o.shape.queryHeads % o.shape.kvHeads == 0,
            "query heads must be a multiple of the KV heads");
    require(o.shape.headDim >= 2 && o.shape.headDim % 2 == 0, "head_dim must be even");
    require(o.shape.hidden >= 4 && o.shape.ffn >= 4 && o.shape.vocab >= 4, "hidden, ffn and vocab must be at least 4");
    require(o.shape.window >= 2, "the sliding window must be at least 2");
    require(o.fault != FaultKind::OtherPrompt ||
                (o.promptLens.size() >= 2 && std::min(o.promptLens[0], o.promptLens[1]) >= std::max(o.fullBlockSize, o.slidingBlockSize)),
            "other_prompt needs two prompts, each at least a block long");
    require(o.fault != FaultKind::WindowShort || (o.shape.window >= 3 && !o.shape.chunked),
            "window_short needs sliding-window layers (not chunked) of a window of at least 3");
    require(o.tpSize >= 1 && (o.shape.kvHeads >= o.tpSize ? o.shape.kvHeads % o.tpSize == 0 : o.tpSize % o.shape.kvHeads == 0),
            "KV heads must divide evenly over TP ranks (or ranks over heads)");
    require(o.fullBlockSize >= 1 && o.slidingBlockSize >= 1, "block sizes must be positive");
    const int copies = o.shape.mla() ? o.tpSize : o.tpSize / std::min(o.tpSize, o.shape.kvHeads);
    require(o.dcpSize >= 1 && copies % o.dcpSize == 0,
            "--dcp must divide the ranks that hold one KV head (tp_size / kv_heads, every rank for MLA): " +
                std::to_string(copies));
    require(o.cpInterleave >= 1 && o.fullBlockSize % o.cpInterleave == 0 && o.slidingBlockSize % o.cpInterleave == 0,
            "--cp-interleave must divide the block sizes");
    require(o.dcpSize == 1 || (o.fault != FaultKind::LayoutTokenMajor && o.fault != FaultKind::LayoutKvHalves),
            "the layout faults need consecutive positions in a block (no DCP)");
    require(o.fault != FaultKind::LayoutBlocksFirst || (!isQuantised(o.kvDtype) && o.dcpSize == 1),
            "layout_blocks_first is synthesised with an unquantised cache (a page keeps its part's scale) and no DCP");
    require(o.dcpSize == 1 || o.fault != FaultKind::ShardSwap,
            "shard_swap under DCP would exchange two DCP ranks' shares of the positions, not two ranks' heads");
    require(!o.promptLens.empty(), "at least one prompt");
    for (int len : o.promptLens)
        require(len >= 2, "prompts need at least 2 tokens");
    require(o.decodeTokens >= 2, "at least 2 decode tokens");
    const std::set<int> stateSpace(o.stateSpaceLayers.begin(), o.stateSpaceLayers.end());
    for (int l : stateSpace)
        require(l >= 0 && l < o.shape.layers, "state-space layers must be layers of the model");
    require(int(stateSpace.size()) < o.shape.layers, "at least one attention layer");
    if (o.shape.mla()) {
        require(o.shape.kvHeads == 1, "an MLA model caches one latent per token: --kv-heads must be 1");
        require(o.shape.ropeHeadDim >= 2 && o.shape.ropeHeadDim % 2 == 0, "the MLA rotary dim must be even");
        require(stateSpace.empty() && !o.shape.chunked && o.shape.quietHeadLayers.empty(),
                "an MLA model has neither state-space, chunked nor quiet-head layers");
        require(!isQuantised(o.kvDtype), "MLA captures are synthesised with a bf16 cache");
        require(mlaFaultSupported(o.fault, o.dcpSize), "fault " + faultName(o.fault) + " does not apply to an MLA cache (one latent "
                                            "per token, replicated over TP ranks)");
    }
    // vLLM's 4-bit caches: NVFP4's block scales cover 16 values, int4's rotation a power of two.
    require(o.kvDtype != DType::Float4E2M1 || o.shape.headDim % 16 == 0, "nvfp4 needs --head-dim a multiple of 16");
    require(o.kvDtype != DType::Int4TokenHead || (o.shape.headDim & (o.shape.headDim - 1)) == 0,
            "int4_per_token_head needs --head-dim a power of two");
    const bool fourBit = o.kvDtype == DType::Float4E2M1 || o.kvDtype == DType::Int4TokenHead;
    require(!fourBit || o.fault != FaultKind::ScaleGranularity, "scale_granularity needs per-tensor or per-head scales, which " +
                                                                     dtypeName(o.kvDtype) + " has not");
    require(o.kvDtype != DType::Int4TokenHead || o.fault != FaultKind::ScaleOtherLayer,
            "scale_other_layer needs a per-tensor scale, which int4_per_token_head has not");
    if (!o.shape.mla())
        require(o.fault != FaultKind::ReplicaDiff || o.shape.kvHeads < o.tpSize,
                "replica_diff needs replicated KV heads (fewer KV heads than TP ranks) or an MLA model");
}

}  // namespace

RopeScaling llama3Scaling()
{
    RopeScaling s;
    s.type = RopeScalingType::Llama3;
    s.factor = 8;
    s.lowFreqFactor = 1;
    s.highFreqFactor = 4;
    s.originalMaxPositions = 32;
    return s;
}

std::vector<FaultKind> allFaultKinds()
{
    std::vector<FaultKind> kinds;
    for (const auto& [k, name] : kFaultNames)
        if (k != FaultKind::None && k != FaultKind::ReplicaDiff && !isNonFiniteFault(k) &&
            k != FaultKind::TokenScale && k != FaultKind::ChannelScale && k != FaultKind::QkvBias && k != FaultKind::Clipped &&
            !isStateFault(k))
            kinds.push_back(k);
    return kinds;
}

std::vector<FaultKind> magnitudeFaultKinds()
{
    return {FaultKind::TokenScale, FaultKind::ChannelScale, FaultKind::QkvBias, FaultKind::Clipped};
}

std::vector<FaultKind> stateFaultKinds()
{
    return {FaultKind::StateStale, FaultKind::StateOtherRequest, FaultKind::StateNotReset, FaultKind::StateZeros,
            FaultKind::StateScale};
}

bool isStateFault(FaultKind kind)
{
    const std::vector<FaultKind> kinds = stateFaultKinds();
    return std::find(kinds.begin(), kinds.end(), kind) != kinds.end();
}

std::string faultName(FaultKind kind)
{
    for (const auto& [k, name] : kFaultNames)
        if (k == kind)
            return name;
    return "?";
}

bool parseFault(const std::string& name, FaultKind& kind)
{
    for (const auto& [k, n] : kFaultNames)
        if (name == n) {
            kind = k;
            return true;
        }
    return false;
}

ModelCaptureOptions demoModelCaptureOptions()
{
    ModelCaptureOptions o;
    o.shape.layers = 24;
    o.shape.hidden = 256;
    o.shape.queryHeads = 16;
    o.shape.kvHeads = 8;
    o.shape.headDim = 128;
    o.shape.ffn = 512;
    o.shape.vocab = 2048;
    o.shape.window = 64;
    o.tpSize = 4;
    o.fullBlockSize = 16;
    o.slidingBlockSize = 16;
    o.promptLens = {100, 180, 260};
    o.decodeTokens = 40;
    o.fault = FaultKind::RopeOffset;
    o.faultLayer = 13;
    o.shape.quietHeadLayers = {0, 23};  // what an fp8 cache with one scale per tensor would crush (kvscope whatif)
    o.shape.quietHeadOctaves = 16;
    o.model = "kvscope-demo: synthetic 24-layer GQA transformer (16 query / 8 KV heads of 128)";
    return o;
}

ModelCaptureOptions demoMlaCaptureOptions()
{
    ModelCaptureOptions o = demoModelCaptureOptions();
    o.shape.layers = 16;
    o.shape.queryHeads = 8;
    o.shape.headDim = 64;
    o.shape.quietHeadLayers.clear();
    o.shape = withMla(o).shape;
    o.shape.kvLoraRank = 256;
    o.shape.ropeHeadDim = 32;
    o.faultLayer = 9;
    o.model = "kvscope-demo-mla: synthetic 16-layer MLA transformer (8 query heads; c_kv 256, k_pe 32)";
    return o;
}

ModelCaptureOptions demoHybridCaptureOptions()
{
    ModelCaptureOptions o = demoModelCaptureOptions();
    o.hybrid = true;
    o.shape.quietHeadLayers = {23};
    o.shape.mamba.heads = 16;
    o.shape.mamba.headDim = 16;
    o.shape.mamba.stateSize = 32;
    o.shape.mamba.groups = 4;
    o.fault = FaultKind::StateStale;
    o.faultLayer = 12;
    o.model = "kvscope-demo-hybrid: synthetic 24-layer hybrid (12 Mamba2 mixers of 16 heads, d_state 32; 12 GQA "
              "attention layers, 16 query / 8 KV heads of 128)";
    return o;
}

ModelCaptureOptions withMla(ModelCaptureOptions o)
{
    o.shape.kvHeads = 1;
    o.shape.kvLoraRank = 4 * o.shape.headDim;
    o.shape.ropeHeadDim = std::max(2, o.shape.headDim / 2 / 2 * 2);
    o.shape.quietHeadLayers.clear();
    o.shape.chunked = false;
    return o;
}

namespace {

// Cache-side faults on one snapshot's layers (ResolvedFault): the engine computed the right
// KV, its cache holds something else. `foreign` is another sequence's engine cache (empty
// unless the fault needs one).
class CacheCorruption {
public:
    CacheCorruption(const ResolvedFault& f, const ModelCaptureOptions& o, const KvCacheConfig& config, std::int64_t promptLen,
                    std::size_t p, const std::vector<LayerCache>& foreign, std::vector<LayerKv>& layers, std::int64_t seqLen)
        : f(f), config(config), p(p), foreign(foreign), layers(layers), heads(cacheHeads(o.shape)), dims(cacheDims(o.shape)),
          at(promptLen + f.step), seqLen(seqLen), window(o.shape.window), promptLen(promptLen),
          chunkStart(f.kind == FaultKind::ChunkBoundary ? chunkOneStart(o, promptLen) : -1)
    {
    }

    void apply()
    {
        switch (f.kind) {
        case FaultKind::RankVScale:
        case FaultKind::GlobalVScale:
        case FaultKind::HeadKScale:
        case FaultKind::TokenScale:
        case FaultKind::ChannelScale:
        case FaultKind::Clipped:
            rescale();
            break;
        case FaultKind::HeadSwap:
        case FaultKind::KvSwap:
        case FaultKind::LaggingWrite:
        case FaultKind::KNegated:
            misplace();
            break;
        case FaultKind::LostWrite:
        case FaultKind::BatchMixup:
        case FaultKind::PrefixReuse:
        case FaultKind::RankUnwritten:
            lose();
            break;
        case FaultKind::OtherLayer:
        case FaultKind::OtherPrompt:
            elsewhere();
            break;
        case FaultKind::WindowShort:
        case FaultKind::WindowOnFull:
            outsideWindow();
            break;
        case FaultKind::LayoutTokenMajor:
        case FaultKind::LayoutKvHalves:
            misread();
            break;
        case FaultKind::LastBlockFill:
        case FaultKind::ChunkBoundary:
            structural();
            break;
        case FaultKind::Nan:
        case FaultKind::Inf:
            if (LayerKv& kv = layers[std::size_t(f.layer)]; at < kv.seq && kv.present[std::size_t(at)])
                kv.k[kv.index(KvPart::K, f.head, at)] = nonFiniteValue(f.kind);
            break;
        default:
            break;
        }
    }

private:
    static void forPositions(LayerKv& kv, const std::function<void(std::int64_t)>& fn)
    {
        for (std::int64_t pos = 0; pos < kv.seq; ++pos)
            if (kv.present[std::size_t(pos)])
                fn(pos);
    }

    // The fault's rank: whether it holds head `h` of layer `l`, and which positions (under DCP
    // its DCP rank's share; every one otherwise).
    bool rankHolds(int l, int h) const
    {
        if (!config.isCompared(layerName(l)))
            return false;
        const std::vector<int> ranks = config.layoutOf(layerName(l)).ranksHolding(h);
        return std::find(ranks.begin(), ranks.end(), f.rank) != ranks.end();
    }

    std::function<bool(std::int64_t)> heldByRank(int l) const
    {
        const int g = config.groupOf(layerName(l));
        if (g < 0 || config.dcpSize == 1)
            return [](std::int64_t) { return true; };
        const KvCacheGroup& group = config.groups[std::size_t(g)];
        return [this, &group, rank = config.dcpRankOf(f.rank)](std::int64_t pos) {
            return config.slotOf(group, pos).dcpRank == rank;
        };
    }

    void scaleV(LayerKv& kv, int head, float factor, const std::function<bool(std::int64_t)>& held) const
    {
        forPositions(kv, [&](std::int64_t pos) {
            if (!held(pos))
                return;
            float* v = kv.v.data() + kv.index(KvPart::V, head, pos);
            for (int i = 0; i < dims.v; ++i)
                v[i] = detmath::roundToBf16(v[i] * factor);
        });
    }

    void fromForeign(int layer, std::int64_t pos)
    {
        LayerKv& kv = layers[std::size_t(layer)];
        const LayerCache& c = foreign[std::size_t(layer)];
        for (KvPart part : {KvPart::K, KvPart::V}) {
            const std::size_t row = kv.rowSize(part);
            std::copy_n((part == KvPart::K ? c.k : c.v).begin() + std::ptrdiff_t(std::size_t(pos) * row), row,
                        kv.values(part).begin() + std::ptrdiff_t(kv.index(part, 0, pos)));
        }
    }

    // Values multiplied by the wrong factor: a rank's V, every V, a head's K; K by a factor per
    // position, V of a head by one per channel; K clipped.
    void rescale()
    {
        if (f.kind == FaultKind::RankVScale)
            for (int l = 0; l < int(layers.size()); ++l)
                for (int h = 0; h < heads; ++h)
                    if (rankHolds(l, h))
                        scaleV(layers[std::size_t(l)], h, 1.25f, heldByRank(l));
        if (f.kind == FaultKind::GlobalVScale)
            for (LayerKv& kv : layers)
                for (int h = 0; h < heads; ++h)
                    scaleV(kv, h, 0.8f, [](std::int64_t) { return true; });
        if (f.kind == FaultKind::HeadKScale) {
            LayerKv& kv = layers[std::size_t(f.layer)];
            forPositions(kv, [&](std::int64_t pos) {
                float* k = kv.k.data() + kv.index(KvPart::K, f.head, pos);
                for (int i = 0; i < dims.k; ++i)
                    k[i] = detmath::roundToBf16(k[i] * 0.5f);
            });
        }
        if (f.kind == FaultKind::TokenScale || f.kind == FaultKind::Clipped) {
            LayerKv& kv = layers[std::size_t(f.layer)];
            forPositions(kv, [&](std::int64_t pos) {
                float* k = kv.k.data() + kv.index(KvPart::K, 0, pos);
                for (std::size_t i = 0; i < kv.rowSize(KvPart::K); ++i)
                    k[i] = f.kind == FaultKind::Clipped ? std::clamp(k[i], -kClipBound, kClipBound)
                                                         : detmath::roundToBf16(k[i] * tokenFactor(pos));
            });
        }
        if (f.kind == FaultKind::ChannelScale) {
            LayerKv& kv = layers[std::size_t(f.layer)];
            forPositions(kv, [&](std::int64_t pos) {
                float* v = kv.v.data() + kv.index(KvPart::V, f.head, pos);
                for (int i = 0; i < dims.v; ++i)
                    v[i] = detmath::roundToBf16(v[i] * channelFactor(i));
            });
        }
    }

    // The right values in the wrong place: heads or K and V swapped, a position's KV one late, K negated.
    void misplace()
    {
        LayerKv& kv = layers[std::size_t(f.layer)];
        if (f.kind == FaultKind::HeadSwap) {
            const int other = swapPartner(f.head, heads);
            forPositions(kv, [&](std::int64_t pos) {
                std::swap_ranges(kv.k.begin() + std::ptrdiff_t(kv.index(KvPart::K, f.head, pos)),
                                 kv.k.begin() + std::ptrdiff_t(kv.index(KvPart::K, f.head, pos) + std::size_t(dims.k)),
                                 kv.k.begin() + std::ptrdiff_t(kv.index(KvPart::K, other, pos)));
                std::swap_ranges(kv.v.begin() + std::ptrdiff_t(kv.index(KvPart::V, f.head, pos)),
                                 kv.v.begin() + std::ptrdiff_t(kv.index(KvPart::V, f.head, pos) + std::size_t(dims.v)),
                                 kv.v.begin() + std::ptrdiff_t(kv.index(KvPart::V, other, pos)));
            });
        }
        if (f.kind == FaultKind::KvSwap)
            std::swap(kv.k, kv.v);
        if (f.kind == FaultKind::LaggingWrite)
            for (std::int64_t pos = kv.seq - 1; pos >= std::max<std::int64_t>(at, 1); --pos)
                if (kv.present[std::size_t(pos)] && kv.present[std::size_t(pos - 1)]) {
                    std::copy_n(kv.k.begin() + std::ptrdiff_t(kv.index(KvPart::K, 0, pos - 1)), kv.rowSize(KvPart::K),
                                kv.k.begin() + std::ptrdiff_t(kv.index(KvPart::K, 0, pos)));
                    std::copy_n(kv.v.begin() + std::ptrdiff_t(kv.index(KvPart::V, 0, pos - 1)), kv.rowSize(KvPart::V),
                                kv.v.begin() + std::ptrdiff_t(kv.index(KvPart::V, 0, pos)));
                }
        if (f.kind == FaultKind::KNegated)
            for (float& x : kv.k)
                x = -x;
    }

    // Values lost or taken from elsewhere: a write never made, another sequence's KV, a rank's
    // share never written.
    void lose()
    {
        if (f.kind == FaultKind::LostWrite)
            for (LayerKv& kv : layers)
                if (at < kv.seq && kv.present[std::size_t(at)]) {
                    std::fill_n(kv.k.begin() + std::ptrdiff_t(kv.index(KvPart::K, 0, at)), kv.rowSize(KvPart::K), 0.0f);
                    std::fill_n(kv.v.begin() + std::ptrdiff_t(kv.index(KvPart::V, 0, at)), kv.rowSize(KvPart::V), 0.0f);
                }
        if (f.kind == FaultKind::BatchMixup && p == 0)
            for (int l = 0; l < int(layers.size()); ++l)
                forPositions(layers[std::size_t(l)], [&](std::int64_t pos) {
                    if (pos >= at)
                        fromForeign(l, pos);
                });
        if (f.kind == FaultKind::PrefixReuse && p == 0) {
            const int g = config.groupOf(layerName(f.layer));
            const std::int64_t blockSize = config.positionsPerEntry(config.groups[std::size_t(g)]);  // one table entry
            const std::int64_t begin = at / blockSize * blockSize;
            for (int l = 0; l < int(layers.size()); ++l)
                if (config.groupOf(layerName(l)) == g)
                    forPositions(layers[std::size_t(l)], [&](std::int64_t pos) {
                        if (pos >= begin && pos < begin + blockSize)
                            fromForeign(l, pos);
                    });
        }
        if (f.kind == FaultKind::RankUnwritten) {
            LayerKv& kv = layers[std::size_t(f.layer)];
            const auto held = heldByRank(f.layer);
            for (int h = 0; h < heads; ++h)
                if (rankHolds(f.layer, h))
                    forPositions(kv, [&](std::int64_t pos) {
                        if (!held(pos))
                            return;
                        std::fill_n(kv.k.begin() + std::ptrdiff_t(kv.index(KvPart::K, h, pos)), dims.k, 0.0f);
                        std::fill_n(kv.v.begin() + std::ptrdiff_t(kv.index(KvPart::V, h, pos)), dims.v, 0.0f);
                    });
        }
    }

    // KV of another place of the capture: the layer before's (layer sharing), or prompt_0's
    // first block in prompt_1's (`foreign` is prompt_0's engine cache).
    void elsewhere()
    {
        if (f.kind == FaultKind::OtherLayer) {
            layers[std::size_t(f.layer)].k = layers[std::size_t(f.layer - 1)].k;
            layers[std::size_t(f.layer)].v = layers[std::size_t(f.layer - 1)].v;
        }
        if (f.kind == FaultKind::OtherPrompt && p == 1)
            for (int l = 0; l < int(layers.size()); ++l) {
                const int g = config.groupOf(layerName(l));
                if (g < 0 || !config.isCompared(layerName(l)))
                    continue;
                const std::int64_t blockSize = config.positionsPerEntry(config.groups[std::size_t(g)]);
                forPositions(layers[std::size_t(l)], [&](std::int64_t pos) {
                    if (pos < blockSize)
                        fromForeign(l, pos);
                });
            }
    }

    // Each TP rank's block of the fault layer read in another order than written. The block as
    // memory holds the rows this snapshot wrote (zeros in the rows not written yet), in the
    // order written; each row is then read from where the other order puts it.
    void misread()
    {
        LayerKv& kv = layers[std::size_t(f.layer)];
        const int g = config.groupOf(layerName(f.layer));
        if (g < 0)
            return;
        const std::int64_t bs = config.groups[std::size_t(g)].blockSize;
        const int group = std::max(1, heads / config.tpSize);  // heads a rank holds
        const int width = dims.k;                              // K and V as wide (no MLA)
        const auto written = [&](std::int64_t pos) { return pos < seqLen && pos < kv.seq && kv.present[std::size_t(pos)]; };
        std::vector<float> memory;  // the rank's block: [part][head][row][dim] as written, head-major
        const LayerKv before = kv;
        for (std::int64_t e = 0; e * bs < kv.seq; ++e)
            for (int base = 0; base < heads; base += group) {
                memory.assign(std::size_t(2 * group * bs * width), 0.0f);
                const auto slot = [&](int part, int h, std::int64_t r) {
                    return memory.data() + ((std::size_t(part) * std::size_t(group) + std::size_t(h)) * std::size_t(bs) + std::size_t(r)) * std::size_t(width);
                };
                for (int part = 0; part < 2; ++part)
                    for (int h = 0; h < group; ++h)
                        for (std::int64_t r = 0; r < bs; ++r)
                            if (written(e * bs + r))
                                std::copy_n(before.at(part ? KvPart::V : KvPart::K, base + h, e * bs + r), width, slot(part, h, r));
                // Memory rows in order: K's head-major rows, then V's (the layout written).
                const auto memoryRow = [&](std::int64_t i) { return memory.data() + std::size_t(i) * std::size_t(width); };
                for (int part = 0; part < 2; ++part)
                    for (int h = 0; h < group; ++h)
                        for (std::int64_t r = 0; r < bs; ++r) {
                            const std::int64_t pos = e * bs + r;
                            if (!written(pos))
                                continue;
                            std::int64_t i = 0;  // the memory row the read takes
                            if (f.kind == FaultKind::LayoutTokenMajor)  // read [rows, heads] within the part
                                i = std::int64_t(part) * group * bs + r * group + h;
                            else  // read K and V alternating: row (h, r)'s K, then its V
                                i = 2 * (std::int64_t(h) * bs + r) + part;
                            std::copy_n(memoryRow(i), width,
                                        kv.values(part ? KvPart::V : KvPart::K).data() + kv.index(part ? KvPart::V : KvPart::K, base + h, pos));
                        }
            }
    }

    // Damage where the engine's structure puts it: the first decode positions of a prompt whose
    // last block is at most half full; prefill chunk 1 on.
    void structural()
    {
        LayerKv& kv = layers[std::size_t(f.layer)];
        const int g = config.groupOf(layerName(f.layer));
        if (g < 0)
            return;
        std::int64_t from = 0, to = 0;
        float factor = 1;
        if (f.kind == FaultKind::LastBlockFill) {
            if (!lastBlockAtMostHalfFull(promptLen, config.groups[std::size_t(g)].blockSize))
                return;
            from = promptLen, to = promptLen + kLastBlockFillTokens, factor = kLastBlockFillFactor;
        } else {
            from = chunkStart, to = promptLen, factor = kChunkBoundaryFactor;
        }
        forPositions(kv, [&](std::int64_t pos) {
            if (pos < from || pos >= to)
                return;
            for (KvPart part : {KvPart::K, KvPart::V}) {
                float* x = kv.values(part).data() + kv.index(part, 0, pos);
                for (std::size_t i = 0; i < kv.rowSize(part); ++i)
                    x[i] = detmath::roundToBf16(x[i] * factor);
            }
        });
    }

    void zeroPosition(LayerKv& kv, std::int64_t pos) const
    {
        if (pos < 0 || pos >= kv.seq || !kv.present[std::size_t(pos)])
            return;
        std::fill_n(kv.k.begin() + std::ptrdiff_t(kv.index(KvPart::K, 0, pos)), kv.rowSize(KvPart::K), 0.0f);
        std::fill_n(kv.v.begin() + std::ptrdiff_t(kv.index(KvPart::V, 0, pos)), kv.rowSize(KvPart::V), 0.0f);
    }

    // A window that does not match the layer's type, as this snapshot (seqLen positions) holds
    // it: a sliding layer short of its oldest position (the reference keeps window - 1, from
    // seqLen - window + 1), or a full layer keeping only the last `window` positions.
    void outsideWindow()
    {
        for (int l = 0; l < int(layers.size()); ++l) {
            const int g = config.groupOf(layerName(l));
            if (g < 0 || !config.isCompared(layerName(l)))
                continue;
            const KvCacheGroup& group = config.groups[std::size_t(g)];
            const bool sliding = group.slidingWindow.has_value();
            const bool full = !sliding && group.specType != SpecType::ChunkedLocal;
            if (f.kind == FaultKind::WindowShort && sliding)
                zeroPosition(layers[std::size_t(l)], seqLen - window + 1);
            if (f.kind == FaultKind::WindowOnFull && full)
                for (std::int64_t pos = 0; pos < seqLen - window; ++pos)
                    zeroPosition(layers[std::size_t(l)], pos);
        }
    }

    const ResolvedFault& f;
    const KvCacheConfig& config;
    const std::size_t p;
    const std::vector<LayerCache>& foreign;
    std::vector<LayerKv>& layers;
    const int heads;
    const HeadDims dims;
    const std::int64_t at;
    const std::int64_t seqLen;  // of the snapshot
    const int window;
    const std::int64_t promptLen;
    const std::int64_t chunkStart;  // chunk_boundary: where prefill chunk 1 starts
};

void corruptCache(const ResolvedFault& f, const ModelCaptureOptions& o, const KvCacheConfig& config,
                  std::int64_t promptLen, std::size_t p, const std::vector<LayerCache>& foreign, std::vector<LayerKv>& layers,
                  std::int64_t seqLen)
{
    CacheCorruption(f, o, config, promptLen, p, foreign, layers, seqLen).apply();
}

// Everything one prompt contributes to the bundle, computed on a worker thread.
struct PromptCapture {
    PromptRecord record;
    std::vector<EngineSnapshot> snapshots;
    std::vector<std::pair<RawTensor, RawTensor>> expected, baseline;  // per layer: K, V
    Logits expectedLogits, actualLogits, baselineLogits;
    nlohmann::json truth;  // what the fault adds to the ground truth for this prompt
    std::vector<LayerStateRecord> engineStates, expectedStates, baselineStates;  // a hybrid model's Mamba2 layers
};

// The engine-side faults the forward pass itself makes (the rest corrupt its cache after).
EngineFaults engineFaultsOf(const ResolvedFault& fault, const ModelShape& shape, std::int64_t promptLen)
{
    EngineFaults f;
    switch (fault.kind) {
    case FaultKind::RopeOffset:
        f.ropeOffsetLayer = fault.layer;
        break;
    case FaultKind::WindowOffByOne:
        f.windowOffByOne = true;
        break;
    case FaultKind::DeadHead:
        f.deadLayer = fault.layer;
        f.deadHead = fault.head;
        f.deadFrom = promptLen + fault.step;
        break;
    case FaultKind::RopePrefill:
        f.ropeLayer = fault.layer;
        f.ropeFrom = std::max<std::int64_t>(1, promptLen / 8);
        f.ropeTo = promptLen * 5 / 8;
        f.ropeShift = 3;
        break;
    case FaultKind::ChunkedPrefill:
        f.ropeLayer = -1;
        f.ropeFrom = std::max<std::int64_t>(4, promptLen / 2 / 4 * 4);
        f.ropeRestart = true;
        break;
    case FaultKind::RopeScaling:
        f.ropeLayer = -1;
        f.ropeDivide = 2.0;
        break;
    case FaultKind::RopeConvention:
        f.ropeLayer = fault.layer;
        f.ropeInterleaved = true;
        break;
    case FaultKind::PartialRotary:
        f.ropeLayer = fault.layer;
        f.ropeDims = (shape.mla() ? shape.ropeHeadDim : shape.headDim) / 2 / 2 * 2;
        break;
    case FaultKind::QkvBias:
        f.biasLayer = fault.layer;
        f.biasHead = fault.head;
        for (int d = 0; d < shape.headDim; ++d) {
            f.biasK.push_back(biasValue(d, false));
            f.biasV.push_back(biasValue(d, true));
        }
        break;
    default:
        break;
    }
    return f;
}

// The teacher: the fp32 baseline decoding greedily (`tokens` grows by its tokens). Every row is
// computed the same way whatever else is in the batch, so this incremental run is also the
// baseline's teacher-forced pass: `cache` and the logits returned are the baseline's.
Logits decodeTeacher(const TinyTransformer& model, std::int64_t steps, std::vector<std::int64_t>& tokens,
                     std::vector<LayerCache>& cache)
{
    const std::int64_t promptLen = std::int64_t(tokens.size());
    Logits out;
    out.steps = steps;
    out.vocab = model.shape().vocab;
    Matrix logits = model.forward(tokens, 0, cache, Numerics::Baseline);
    std::int64_t row = promptLen - 1;
    for (std::int64_t g = 0; g < steps; ++g) {
        out.values.insert(out.values.end(), logits.row(int(row)), logits.row(int(row)) + logits.cols);
        tokens.push_back(argmaxRow(logits, row));
        logits = model.forward({tokens.back()}, promptLen + g, cache, Numerics::Baseline);
        row = 0;
    }
    return out;
}

// What the engine's cache holds when the capture reads it: the validation loop's snapshot at each
// divergence (the engine's own token at it) and the last one over every position.
struct Snapshot {
    std::int64_t seqLen;
    std::int64_t validatedUntil;
    std::vector<LayerKv> layers;
};

std::vector<Snapshot> engineSnapshots(const TinyTransformer& model, const std::vector<LayerCache>& engine,
                                      const Matrix& engineLogits, const std::vector<std::int64_t>& divergences,
                                      const EngineFaults& faults, std::int64_t promptLen, std::int64_t total)
{
    const ModelShape& shape = model.shape();
    std::vector<Snapshot> snapshots;
    for (std::int64_t d : divergences) {
        if (int(snapshots.size()) + 1 >= kMaxSnapshots || d + 2 > total)
            break;
        // This call decoded up to d, sampled its own token there and one more: its cache
        // holds the wrong token's KV at d (never validated), the teacher's before.
        std::vector<LayerCache> prefix = model.prefix(engine, d, Numerics::Engine, faults);
        model.forward({argmaxRow(engineLogits, d - 1)}, d, prefix, Numerics::Engine, faults, promptLen);
        Snapshot s{d + 2, d, {}};
        for (const LayerCache& c : prefix)
            s.layers.push_back(toLayerKv(c, shape, d + 1));
        snapshots.push_back(std::move(s));
    }
    Snapshot last{total, total - 1, {}};
    for (const LayerCache& c : engine)
        last.layers.push_back(toLayerKv(c, shape, total - 1));
    snapshots.push_back(std::move(last));
    return snapshots;
}

// Quantised caches: each layer's scales from the engine's own prompt KV, per layer and part,
// and per head.
std::map<std::string, CacheScaling> cacheScalings(const std::vector<LayerCache>& engine, const ModelShape& shape,
                                                  DType kvDtype, ScaleGranularity granularity)
{
    const auto largest = [&](const std::vector<float>& x, int head) {
        float m = 1e-6f;
        const std::size_t dim = std::size_t(shape.headDim);
        for (std::size_t i = 0; i < x.size(); ++i)
            if (head < 0 || int(i / dim) % shape.kvHeads == head)
                m = std::max(m, std::fabs(x[i]));
        // NVFP4's per-tensor scale is its global one (format/nvfp4.h); int4's are per token and head.
        return kvDtype == DType::Float4E2M1 ? nvfp4GlobalScale(m) : m / float(maxFinite(kvDtype));
    };
    std::map<std::string, CacheScaling> scalings;
    for (int l = 0; l < shape.layers; ++l) {
        const LayerCache& c = engine[std::size_t(l)];
        CacheScaling scaling{granularity, largest(c.k, -1), largest(c.v, -1), {}, {}};
        for (int h = 0; h < shape.kvHeads; ++h) {
            scaling.kHeads.push_back(largest(c.k, h));
            scaling.vHeads.push_back(largest(c.v, h));
        }
        scalings[layerName(l)] = scaling;
    }
    return scalings;
}

// A capture's faults on its paged snapshots: scales recorded wrong, shards swapped, table
// entries pointing elsewhere, a replica's copy differing; what they did goes into `truth`.
class SnapshotFaults {
public:
    SnapshotFaults(const ResolvedFault& fault, const KvCacheConfig& config, const std::map<std::string, CacheScaling>& scalings,
                   std::size_t prompt, std::int64_t promptLen, std::int64_t total, nlohmann::json& truth)
        : m_fault(fault), m_config(config), m_scalings(scalings), m_prompt(prompt), m_promptLen(promptLen), m_total(total),
          m_truth(truth), m_faulty(layerName(fault.layer)), m_id("prompt_" + std::to_string(prompt))
    {
        // scale_other_layer: the layer whose K scale differs most from the faulty layer's.
        m_other = m_faulty;
        if (!scalings.count(m_faulty))  // no fault, or one without a layer
            return;
        for (const auto& [name, scaling] : scalings)
            if (config.isCompared(name) && std::fabs(std::log(scaling.k / scalings.at(m_faulty).k)) >
                                               std::fabs(std::log(scalings.at(m_other).k / scalings.at(m_faulty).k)))
                m_other = name;
        const CacheScaling& faulty = scalings.at(m_faulty);
        if (fault.kind == FaultKind::ScaleGranularity) {  // how far the heads' own scales are from the tensor's
            double k = 1, v = 1;
            for (std::size_t h = 0; h < faulty.kHeads.size(); ++h) {
                k = std::min(k, double(faulty.kHeads[h] / faulty.k));
                v = std::min(v, double(faulty.vHeads[h] / faulty.v));
            }
            truth["k_ratio"] = k;
            truth["v_ratio"] = v;
        }
        if (fault.kind == FaultKind::ScaleOtherLayer) {
            truth["scale_of"] = m_other;
            truth["k_ratio"] = faulty.k / scalings.at(m_other).k;
            truth["v_ratio"] = faulty.v / scalings.at(m_other).v;
        }
    }

    // How the engine scales `layer`'s cache (the scale faults quantise with the wrong ones).
    CacheScaling scalingOf(const std::string& layer) const
    {
        CacheScaling scaling = m_scalings.at(layer);
        if (layer == m_faulty && m_fault.kind == FaultKind::ScaleGranularity)
            scaling.granularity = ScaleGranularity::Tensor;  // quantised per tensor ...
        if (layer == m_faulty && m_fault.kind == FaultKind::ScaleOtherLayer)
            scaling.k = m_scalings.at(m_other).k, scaling.v = m_scalings.at(m_other).v;
        return scaling;
    }

    // Snapshot `s` of `snapshots`, as paged.
    void apply(EngineSnapshot& snap, const std::vector<Snapshot>& snapshots, std::size_t s)
    {
        recordScales(snap);
        if (m_fault.kind == FaultKind::ShardSwap)
            std::swap(snap.ranks[std::size_t(m_fault.rank)][m_faulty], snap.ranks[std::size_t(m_fault.rank + 1)][m_faulty]);
        if (m_fault.kind == FaultKind::ReplicaWrongHead || m_fault.kind == FaultKind::ReadRankWrongHead)
            snap.ranks[std::size_t(m_fault.rank)][m_faulty] = snap.ranks[std::size_t(m_fault.truth.at("holds_rank").get<int>())][m_faulty];
        if (m_fault.kind == FaultKind::LayoutBlocksFirst)
            for (auto& rank : snap.ranks)
                blocksFirst(rank[m_faulty]);
        if (m_fault.kind == FaultKind::Fp8Scale)
            for (auto& rank : snap.ranks)
                for (RawTensor* part : {&rank[m_faulty].first, &rank[m_faulty].second}) {
                    if (part->scales.empty() || part->dtype == DType::Float4E2M1)  // NVFP4: its global scale
                        part->scale *= 2.0f;
                    if (part->dtype == DType::Float4E2M1)
                        continue;
                    for (float& scale : part->scales)
                        scale *= 2.0f;
                }
        // The snapshot whose positions hold the faulty one (snapshot_merge.h): the table entry
        // is wrong where the capture takes that position from.
        const std::int64_t stalePosition = m_promptLen + m_fault.step;
        const bool holdsStale = (s == 0 || stalePosition >= snapshots[s - 1].validatedUntil) &&
                                (stalePosition < snapshots[s].validatedUntil || s + 1 == snapshots.size());
        if (m_fault.kind == FaultKind::StaleBlock && m_prompt == 0 && holdsStale)
            staleBlock(snap, stalePosition);
        if (m_fault.kind == FaultKind::BlockShift && m_prompt == 0)
            blockShift(snap, snapshots[s].seqLen);
        if (m_fault.kind == FaultKind::ReplicaDiff && m_prompt == 0 && holdsStale)
            replicaDiff(snap, stalePosition);
    }

private:
    void recordScales(EngineSnapshot& snap) const
    {
        if (m_fault.kind == FaultKind::ScaleGranularity)  // ... recorded with the per-head scales
            for (int r = 0; r < int(snap.ranks.size()); ++r)
                for (auto* part : {&snap.ranks[std::size_t(r)][m_faulty].first, &snap.ranks[std::size_t(r)][m_faulty].second}) {
                    const std::vector<float>& all = part == &snap.ranks[std::size_t(r)][m_faulty].first
                                                        ? m_scalings.at(m_faulty).kHeads : m_scalings.at(m_faulty).vHeads;
                    std::vector<float> scales;
                    for (int j = 0; j < part->shape[1]; ++j)
                        scales.push_back(all[std::size_t(m_config.layoutOf(m_faulty).headOnRank(r, j))]);
                    part->setScales(ScaleGranularity::Head, std::move(scales));
                }
        if (m_fault.kind == FaultKind::ScaleOtherLayer)  // recorded with its own scale
            for (auto& rank : snap.ranks) {
                rank[m_faulty].first.scale = m_scalings.at(m_faulty).k;
                rank[m_faulty].second.scale = m_scalings.at(m_faulty).v;
            }
    }

    // One table entry points at a block that holds another sequence's data.
    void staleBlock(EngineSnapshot& snap, std::int64_t stalePosition)
    {
        const int g = m_config.groupOf(m_faulty);
        const std::int64_t blockSize = m_config.positionsPerEntry(m_config.groups[std::size_t(g)]);  // one table entry
        const std::int64_t logical = stalePosition / blockSize;
        std::set<std::int32_t> used;
        for (const BlockTable& t : snap.blockTables)
            used.insert(t.entries.begin(), t.entries.end());
        std::int32_t stale = m_config.numBlocks - 1;
        while (stale > 0 && used.count(stale))
            --stale;
        BlockTable& table = snap.blockTables[std::size_t(g)];
        m_truth["group"] = g;
        m_truth["logical_block"] = logical;
        m_truth["positions"] = {logical * blockSize, std::min<std::int64_t>((logical + 1) * blockSize, m_total - 1) - 1};
        m_truth["original_block"] = table.entries[std::size_t(logical)];
        m_truth["stale_block"] = stale;
        m_truth["prompt"] = m_id;
        table.entries[std::size_t(logical)] = stale;
    }

    // From the block of the fault position on, each entry points one logical block earlier (a
    // table read one entry off).
    void blockShift(EngineSnapshot& snap, std::int64_t seqLen)
    {
        const int g = m_config.groupOf(m_faulty);
        const std::int64_t blockSize = m_config.positionsPerEntry(m_config.groups[std::size_t(g)]);  // one table entry
        BlockTable& table = snap.blockTables[std::size_t(g)];
        const std::int64_t used = (seqLen + blockSize - 1) / blockSize;
        const std::int64_t from = std::max<std::int64_t>(1, (m_promptLen + m_fault.step) / blockSize);
        for (std::int64_t logical = std::min<std::int64_t>(used, std::int64_t(table.entries.size())) - 1; logical >= from;
             --logical)
            table.entries[std::size_t(logical)] = table.entries[std::size_t(logical - 1)];
        m_truth["group"] = g;
        m_truth["from_logical_block"] = from;
    }

    // A rank's cache of the layer as written K/V-first, read blocks-first: each page read is
    // the page the written order puts at its place in memory (kv/block_layout.h).
    static void blocksFirst(std::pair<RawTensor, RawTensor>& kv)
    {
        const std::array<RawTensor, 2> written{kv.first, kv.second};
        const std::int64_t blocks = written[0].shape[0];
        const std::size_t page = std::size_t(written[0].stride(0)) * dtypeSize(written[0].dtype);
        const CacheMisread misread = cacheMisreads(blocks).front();  // kv_first read blocks_first
        for (KvPart part : {KvPart::K, KvPart::V})
            for (std::int64_t b = 0; b < blocks; ++b) {
                const CachePage from = misread.source({part, b});
                std::copy_n(written[std::size_t(from.part)].bytes.data() + std::size_t(from.block) * page, page,
                            (part == KvPart::K ? kv.first : kv.second).bytes.data() + std::size_t(b) * page);
            }
    }

    // One rank's copy of the block holding the fault position differs in the last bit.
    void replicaDiff(EngineSnapshot& snap, std::int64_t stalePosition)
    {
        const int g = m_config.groupOf(m_faulty);
        const KvCacheGroup& group = m_config.groups[std::size_t(g)];
        const std::int64_t logical = stalePosition / m_config.positionsPerEntry(group);
        const std::int32_t block = snap.blockTables[std::size_t(g)].entries[std::size_t(logical)];
        RawTensor& copy = snap.ranks[std::size_t(m_fault.rank)][m_faulty].first;
        const std::size_t rowBytes = std::size_t(copy.stride(0)) * dtypeSize(copy.dtype);
        for (std::size_t i = 0; i < rowBytes; i += dtypeSize(copy.dtype))
            copy.bytes[std::size_t(block) * rowBytes + i] ^= 1;  // little-endian: the lowest mantissa bit
        m_truth["prompt"] = m_id;
        m_truth["block"] = block;
        m_truth["logical_block"] = logical;
    }

    const ResolvedFault& m_fault;
    const KvCacheConfig& m_config;
    const std::map<std::string, CacheScaling>& m_scalings;
    const std::size_t m_prompt;
    const std::int64_t m_promptLen, m_total;
    nlohmann::json& m_truth;
    const std::string m_faulty, m_id;
    std::string m_other;
};

PromptCapture capturePrompt(const TinyTransformer& model, const ModelCaptureOptions& o, const KvCacheConfig& config,
                            const ResolvedFault& fault, std::size_t p, std::vector<std::int64_t> tokens,
                            const std::vector<std::int64_t>& firstPrompt, const StateFaultPlan& statePlan)
{
    const ModelShape& shape = o.shape;
    const std::int64_t promptLen = std::int64_t(tokens.size());
    const std::int64_t steps = o.decodeTokens;
    const std::int64_t total = promptLen + steps;
    const EngineFaults engineFaults = [&] {
        EngineFaults f = engineFaultsOf(fault, shape, promptLen);
        if (statePlan.kind == FaultKind::None || statePlan.prompt != p)
            return f;
        // prompt_0's engine run over its prompt and teacher tokens, for another request's state
        std::vector<LayerCache> source;
        std::int64_t sourceEnd = 0;
        if (statePlan.needsOtherPrompt()) {
            std::vector<std::int64_t> first = firstPrompt;
            std::vector<LayerCache> teacher;
            decodeTeacher(model, steps, first, teacher);
            first.pop_back();  // the last teacher token is never fed
            sourceEnd = std::int64_t(first.size());
            model.forward(first, 0, source, Numerics::Engine);
        }
        addStateFault(statePlan, model, source, sourceEnd, f);
        return f;
    }();
    PromptCapture out;

    std::vector<LayerCache> base;
    Logits baseLogits = decodeTeacher(model, steps, tokens, base);
    // Teacher-forced passes over the same tokens.
    std::vector<LayerCache> expected, engine;
    const Matrix expectedLogits = model.forward(tokens, 0, expected, Numerics::Expected);
    const Matrix engineLogits = model.forward(tokens, 0, engine, Numerics::Engine, engineFaults, promptLen);

    // The validation loop: divergences where the engine's argmax leaves the teacher.
    std::vector<std::int64_t> divergences;
    for (std::int64_t g = 0; g < steps; ++g)
        if (argmaxRow(engineLogits, promptLen - 1 + g) != tokens[std::size_t(promptLen + g)])
            divergences.push_back(promptLen + g);
    std::vector<Snapshot> snapshots = engineSnapshots(model, engine, engineLogits, divergences, engineFaults, promptLen, total);

    // Cache-side faults, on what every snapshot holds.
    std::vector<LayerCache> foreign;
    if ((fault.kind == FaultKind::BatchMixup || fault.kind == FaultKind::PrefixReuse) && p == 0) {
        std::vector<std::int64_t> other(tokens.size());
        for (std::size_t i = 0; i < other.size(); ++i)
            other[i] = (tokens[i] * 7 + 13 + std::int64_t(i)) % shape.vocab;
        model.forward(other, 0, foreign, Numerics::Engine);
    }
    if (fault.kind == FaultKind::OtherPrompt && p == 1)  // prompt_0's own engine KV (each row computed alone)
        model.forward(firstPrompt, 0, foreign, Numerics::Engine);
    for (Snapshot& snap : snapshots)
        corruptCache(fault, o, config, promptLen, p, foreign, snap.layers, snap.seqLen);

    if (fault.kind == FaultKind::NanExpected)  // the reference, not the engine: one value of K
        expected[std::size_t(fault.layer)].k[std::size_t(((promptLen + fault.step) * cacheHeads(shape) + fault.head) *
                                                         cacheDims(shape).k)] = nonFiniteValue(fault.kind);

    const ScaleGranularity granularity = fault.kind == FaultKind::ScaleGranularity ? ScaleGranularity::Head : o.kvScale;
    const std::map<std::string, CacheScaling> scalings =
        cacheScalings(engine, shape, config.firstCompared().dtype, granularity);
    SnapshotFaults snapshotFaults(fault, config, scalings, p, promptLen, total, out.truth);
    for (std::size_t s = 0; s < snapshots.size(); ++s) {
        const PagedLayout layout(config, snapshots[s].seqLen, o.seed * 1000 + p * 10 + s);
        EngineSnapshot snap = layout.snapshot(
            [&](const std::string& layer) { return snapshots[s].layers[std::size_t(std::stoi(layer.substr(13)))]; },
            // (a cache read in the other page order: every block kept, those the right pages went to)
            fault.kind != FaultKind::LayoutBlocksFirst, [&](const std::string& layer) { return snapshotFaults.scalingOf(layer); });
        snap.validatedUntil = snapshots[s].validatedUntil;
        snapshotFaults.apply(snap, snapshots, s);
        out.snapshots.push_back(std::move(snap));
    }

    out.record.id = "prompt_" + std::to_string(p);
    out.record.inputIds.assign(tokens.begin(), tokens.begin() + promptLen);
    out.record.teacherTokens.assign(tokens.begin() + promptLen, tokens.end());
    out.record.divergencePositions = divergences;
    if (const std::string spec = provenanceSpecOf(o); !spec.empty())
        out.record.provenance = provenanceFromSpec(spec, promptLen, total - promptLen);
    for (std::int64_t t : tokens)
        out.record.tokenStrings.push_back(tokenText(t));

    for (int l = 0; l < shape.layers; ++l) {
        if (shape.isMamba(l)) {  // no KV: its state below
            out.expected.emplace_back();
            if (o.baseline)
                out.baseline.emplace_back();
            continue;
        }
        // HF keeps only window - 1 positions of sliding-window layers (every position of chunked ones).
        const std::int64_t from =
            model.sliding(l) && !shape.chunked ? std::max<std::int64_t>(0, total - (shape.window - 1)) : 0;
        const LayerCache& e = expected[std::size_t(l)];
        out.expected.emplace_back(referenceTensor(e.k, shape, KvPart::K, from, total, DType::BFloat16),
                                  referenceTensor(e.v, shape, KvPart::V, from, total, DType::BFloat16));
        if (o.baseline) {
            const LayerCache& b = base[std::size_t(l)];
            out.baseline.emplace_back(referenceTensor(b.k, shape, KvPart::K, from, total, DType::Float32),
                                      referenceTensor(b.v, shape, KvPart::V, from, total, DType::Float32));
        }
    }
    // A hybrid model's Mamba2 states at the checkpoints of the engine's run (the last teacher
    // token is never fed), the references' at the same positions.
    const std::vector<std::int64_t> positions = checkpointPositions(total - 1, shape.mambaCheckpointEvery);
    for (int l : shape.mambaLayers) {
        out.engineStates.push_back(engineStateRecord(model, engine, l, positions, engineFaults, o.tpSize));
        if (o.engineOnly)
            continue;
        out.expectedStates.push_back(referenceStateRecord(model, expected, l, positions, Numerics::Expected));
        if (o.baseline)
            out.baselineStates.push_back(referenceStateRecord(model, base, l, positions, Numerics::Baseline));
    }
    out.expectedLogits = stepLogits(expectedLogits, promptLen - 1, steps);
    out.actualLogits = stepLogits(engineLogits, promptLen - 1, steps);
    out.baselineLogits = std::move(baseLogits);
    return out;
}

}  // namespace

void writeModelCapture(const std::string& path, const ModelCaptureOptions& options)
{
    const ModelCaptureOptions o = withHybridDefaults(options);
    checkOptions(o);
    checkHybridOptions(o);
    const StateFaultPlan statePlan = planStateFault(o);
    const ResolvedFault fault = [&] {
        if (!isStateFault(o.fault))
            return resolveFault(o);
        ResolvedFault f;
        f.kind = statePlan.kind;
        f.layer = statePlan.layer;
        f.truth = statePlan.truth;
        return f;
    }();
    const bool quantisedFault = fault.kind == FaultKind::Fp8Scale || fault.kind == FaultKind::ScaleGranularity ||
                                fault.kind == FaultKind::ScaleOtherLayer;
    const DType kvDtype = quantisedFault && !isQuantised(o.kvDtype) ? DType::Float8E4M3 : o.kvDtype;

    std::int64_t longest = 0;
    for (int len : o.promptLens)
        longest = std::max<std::int64_t>(longest, len + o.decodeTokens);
    const KvCacheConfig config = makeConfig(o, longest, kvDtype);

    const TinyTransformer model(o.shape, o.seed);

    BundleMetadata meta;
    meta.engineOnly = o.engineOnly;
    meta.model = o.model;
    meta.engine = "kvscope synthetic engine (bf16, split-K GEMMs, fp32 norms and RoPE, flash-style attention)";
    meta.notes = "Made by kvscope synth from a small transformer with deterministic weights.";
    nlohmann::json optionsJson = {{"layers", o.shape.layers}, {"hidden", o.shape.hidden}, {"query_heads", o.shape.queryHeads},
                                  {"kv_heads", o.shape.kvHeads}, {"head_dim", o.shape.headDim}, {"ffn", o.shape.ffn},
                                  {"vocab", o.shape.vocab}, {"window", o.shape.window}, {"sliding_window_spec", o.slidingWindowSpec},
                                  {"chunked", o.shape.chunked}, {"state_space_layers", o.stateSpaceLayers},
                                  {"seed", o.seed}, {"tp_size", o.tpSize}, {"full_block_size", o.fullBlockSize},
                                  {"sliding_block_size", o.slidingBlockSize}, {"kv_dtype", dtypeName(kvDtype)},
                                  {"kv_scale", granularityName(o.kvScale)}, {"dcp_size", o.dcpSize},
                                  {"cp_kv_cache_interleave_size", o.cpInterleave},
                                  {"prompt_lens", o.promptLens}, {"decode_tokens", o.decodeTokens}};
    if (o.hybrid) {
        const Mamba2Shape& m = o.shape.mamba;
        optionsJson["hybrid"] = true;
        optionsJson["mamba2"] = {{"layers", o.shape.mambaLayers}, {"heads", m.heads}, {"head_dim", m.headDim},
                                 {"state_size", m.stateSize}, {"groups", m.groups}, {"conv_width", m.convWidth},
                                 {"ssm_cache_dtype", m.engineStateBf16 ? "bfloat16" : "float32"},
                                 {"checkpoint_every", o.shape.mambaCheckpointEvery}};
    }
    if (o.shape.mla()) {
        optionsJson["kv_lora_rank"] = o.shape.kvLoraRank;
        optionsJson["qk_rope_head_dim"] = o.shape.ropeHeadDim;
    }
    // The model's RoPE as the HF config gives it (tiny_transformer.h: rotated halves, base 10000;
    // MLA rotates k_pe, all of it).
    nlohmann::json rope{{"theta", 10000.0}, {"rotary_dim", o.shape.mla() ? o.shape.ropeHeadDim : o.shape.headDim}, {"style", "neox"}};
    if (o.shape.llama3Rope) {
        const RopeScaling s = llama3Scaling();
        rope["scaling"] = {{"type", "llama3"}, {"factor", s.factor}, {"low_freq_factor", s.lowFreqFactor},
                           {"high_freq_factor", s.highFreqFactor}, {"original_max_position_embeddings", s.originalMaxPositions}};
        optionsJson["rope_scaling"] = "llama3";
    }
    meta.extra["rope"] = jsonText(rope);
    meta.extra["synthetic_options"] = jsonText(optionsJson);

    // The prompts' tokens, drawn in order from one stream.
    std::mt19937_64 rng(o.seed * 7919 + 17);
    std::uniform_int_distribution<std::int64_t> pick(0, o.shape.vocab - 1);
    std::vector<std::vector<std::int64_t>> prompts;
    for (int len : o.promptLens) {
        prompts.emplace_back();
        for (int i = 0; i < len; ++i)
            prompts.back().push_back(pick(rng));
    }

    // Prompts run in parallel, longest first; each one's numbers do not depend on the thread.
    std::vector<std::size_t> order(prompts.size());
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
        return prompts[a].size() > prompts[b].size();
    });
    std::vector<PromptCapture> captures(prompts.size());
    std::vector<std::exception_ptr> errors(prompts.size());
    std::atomic<std::size_t> next{0};
    const auto work = [&] {
        for (std::size_t i; (i = next++) < order.size();) {
            const std::size_t p = order[i];
            try {
                captures[p] = capturePrompt(model, o, config, fault, p, prompts[p], prompts.front(), statePlan);
            } catch (...) {
                errors[p] = std::current_exception();
            }
        }
    };
    const int threads = std::clamp(o.threads > 0 ? o.threads : int(std::thread::hardware_concurrency()), 1,
                                   int(prompts.size()));
    std::vector<std::thread> pool;
    for (int t = 1; t < threads; ++t)
        pool.emplace_back(work);
    work();
    for (std::thread& t : pool)
        t.join();
    for (const std::exception_ptr& e : errors)
        if (e)
            std::rethrow_exception(e);

    nlohmann::json truth = fault.truth;
    BundleWriter writer(path, meta, config);
    for (PromptCapture& c : captures) {
        const std::string& id = c.record.id;
        writer.addPrompt(c.record);
        for (const EngineSnapshot& snap : c.snapshots)
            writer.addSnapshot(id, snap);
        for (int l = 0; l < o.shape.layers; ++l) {
            if (o.shape.isMamba(l) ||
                config.groups[std::size_t(config.groupOf(layerName(l)))].specType == SpecType::NotCompared)
                continue;  // a state-space layer: no KV in the capture
            if (o.engineOnly)
                continue;
            const auto& [ek, ev] = c.expected[std::size_t(l)];
            writer.addReference(id, ReferenceRole::Expected, layerName(l), ek, ev);
            if (o.baseline) {
                const auto& [bk, bv] = c.baseline[std::size_t(l)];
                writer.addReference(id, ReferenceRole::Baseline, layerName(l), bk, bv);
            }
        }
        writer.addLogits(id, LogitsRole::Expected, c.expectedLogits);
        writer.addLogits(id, LogitsRole::Actual, c.actualLogits);
        if (o.baseline)
            writer.addLogits(id, LogitsRole::Baseline, c.baselineLogits);
        for (const LayerStateRecord& state : c.engineStates)
            writer.addEngineState(id, state);
        for (const LayerStateRecord& state : c.expectedStates)
            writer.addReferenceState(id, ReferenceRole::Expected, state);
        for (const LayerStateRecord& state : c.baselineStates)
            writer.addReferenceState(id, ReferenceRole::Baseline, state);
        if (!c.truth.is_null())
            truth.update(c.truth);
        c = {};  // release it before the next prompt's writes
    }
    writer.setMetadata("synthetic_fault", jsonText(truth));
    writer.finish();
    if (o.impact && !o.engineOnly)
        addImpact(path, model, o);
}

}  // namespace kvscope::synth
