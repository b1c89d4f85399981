#include "synth/tiny_transformer.h"

#include "util/deterministic_math.h"

#include <algorithm>
#include <span>
#include <cmath>
#include <stdexcept>
#include <string>
#include <type_traits>

namespace kvscope::synth {

namespace {

using detmath::roundToBf16;

Matrix rmsNorm(const Matrix& x, const std::vector<float>& weight, Numerics n)
{
    Matrix out(x.rows, x.cols);
    for (int r = 0; r < x.rows; ++r) {
        const float* in = x.row(r);
        float squares = 0;
        for (int c = 0; c < x.cols; ++c)
            squares += in[c] * in[c];
        const float inverseRms = 1.0f / std::sqrt(squares / float(x.cols) + 1e-6f);
        float* o = out.row(r);
        for (int c = 0; c < x.cols; ++c) {
            const float normed = in[c] * inverseRms;
            switch (n) {
            case Numerics::Baseline: o[c] = normed * weight[std::size_t(c)]; break;
            // HF: normalised in fp32, cast to bf16, then times the bf16 weight.
            case Numerics::Expected: o[c] = roundToBf16(roundToBf16(normed) * weight[std::size_t(c)]); break;
            // A fused kernel: the weight applied in fp32, one rounding.
            case Numerics::Engine: o[c] = roundToBf16(normed * weight[std::size_t(c)]); break;
            }
        }
    }
    return out;
}

// Rotate-half RoPE of one token's heads [heads, dim] in place.
void rope(float* x, int heads, int dim, std::int64_t position, const std::vector<float>& invFreq, Numerics n)
{
    const int half = dim / 2;
    for (int i = 0; i < half; ++i) {
        const float angle = float(position) * invFreq[std::size_t(i)];
        double s = 0, c = 0;
        detmath::sinCos(angle, s, c);
        float cosA = float(c), sinA = float(s);
        if (n == Numerics::Expected) {  // HF casts cos/sin to the model's dtype
            cosA = roundToBf16(cosA);
            sinA = roundToBf16(sinA);
        }
        for (int h = 0; h < heads; ++h) {
            float* lo = x + std::size_t(h) * std::size_t(dim) + std::size_t(i);
            float* hi = lo + half;
            const float a = *lo, b = *hi;
            switch (n) {
            case Numerics::Baseline:
                *lo = a * cosA + -b * sinA;
                *hi = b * cosA + a * sinA;
                break;
            case Numerics::Expected:  // bf16 tensors: each product and the sum rounded
                *lo = roundToBf16(roundToBf16(a * cosA) + roundToBf16(-b * sinA));
                *hi = roundToBf16(roundToBf16(b * cosA) + roundToBf16(a * sinA));
                break;
            case Numerics::Engine:  // fp32 in registers, one rounding
                *lo = roundToBf16(a * cosA + -b * sinA);
                *hi = roundToBf16(b * cosA + a * sinA);
                break;
            }
        }
    }
}

// The model's inverse frequency of pair i of `rotary` dims: 1 / 10000^(2i / rotary), under
// Llama 3.1's scaling when the model has it (plain arithmetic after the exp: the same bits on
// every CPU).
double invFreq(int i, int rotary, bool llama3)
{
    const double f = detmath::exp(-(2.0 * i / rotary) * 9.21034037197618273607);  // ln 10000
    return llama3 ? llama3InverseFrequency(f, llama3Scaling()) : f;
}

// RoPE of one token's heads in place, another way than the model's (EngineFaults): engine
// numerics (fp32, one rounding).
void faultyRope(float* x, int heads, int dim, std::int64_t position, const EngineFaults& f, bool llama3)
{
    const int rotary = f.ropeDims > 0 ? f.ropeDims : dim;
    const int half = rotary / 2;
    const double pos = double(f.ropeRestart ? position - f.ropeFrom : position + f.ropeShift) / f.ropeDivide;
    for (int i = 0; i < half; ++i) {
        const float angle = float(pos * double(float(invFreq(i, rotary, llama3))));
        double sd = 0, cd = 0;
        detmath::sinCos(angle, sd, cd);
        const float cosA = float(cd), sinA = float(sd);
        for (int h = 0; h < heads; ++h) {
            float* base = x + std::size_t(h) * std::size_t(dim);
            float* lo = base + (f.ropeInterleaved ? 2 * i : i);
            float* hi = base + (f.ropeInterleaved ? 2 * i + 1 : i + half);
            const float a = *lo, b = *hi;
            *lo = roundToBf16(a * cosA + -b * sinA);
            *hi = roundToBf16(b * cosA + a * sinA);
        }
    }
}

void appendRows(std::vector<float>& to, const Matrix& rows)
{
    to.insert(to.end(), rows.values.begin(), rows.values.end());
}

// Appends `keys` [n, key heads * key dim] to the cache's per-channel keys, at positions from
// c.positions on.
void appendKeys(LayerCache& c, const Matrix& keys)
{
    const std::int64_t positions = c.positions + keys.rows;
    const std::size_t channels = std::size_t(keys.cols);
    c.keyChannels = channels;
    if (positions > c.capacity) {
        const std::int64_t capacity = std::max<std::int64_t>({positions, 2 * c.capacity, 64});
        std::vector<float> grown(channels * std::size_t(capacity));
        for (std::size_t ch = 0; ch < channels; ++ch)
            std::copy_n(c.keysByChannel.data() + ch * std::size_t(c.capacity), c.positions,
                        grown.data() + ch * std::size_t(capacity));
        c.keysByChannel = std::move(grown);
        c.capacity = capacity;
    }
    for (int i = 0; i < keys.rows; ++i)
        for (std::size_t ch = 0; ch < channels; ++ch)
            c.keysByChannel[ch * std::size_t(c.capacity) + std::size_t(c.positions + i)] = keys.row(i)[ch];
    c.positions = positions;
}

// The engine's state fault (EngineFaults), on `state` after faults.stateAt positions: the conv
// state stays in bf16 (the model's dtype), the SSM state in the engine's.
void applyStateFault(const EngineFaults& f, const LayerCache& c, const Mamba2Shape& shape, Mamba2State& state)
{
    using Fault = EngineFaults::StateFault;
    if (f.stateFault == Fault::Stale) {
        const auto source = std::find_if(c.checkpoints.begin(), c.checkpoints.end(),
                                         [&](const LayerCache::Checkpoint& k) { return k.positions == f.stateSource; });
        if (source == c.checkpoints.end())
            throw std::logic_error("state_stale: no checkpoint at position " + std::to_string(f.stateSource));
        state = source->state;
        return;
    }
    if (f.stateFault == Fault::Replace) {
        state = f.stateOther;
        return;
    }
    const auto change = [&](std::vector<float>& part, const std::vector<float>& other, bool bf16) {
        for (std::size_t i = 0; i < part.size(); ++i) {
            const float v = f.stateFault == Fault::Scale ? part[i] * f.stateFactor : part[i] + f.stateFactor * other[i];
            part[i] = bf16 ? roundToBf16(v) : v;
        }
    };
    change(state.conv, f.stateOther.conv, true);
    change(state.ssm, f.stateOther.ssm, shape.engineStateBf16);
}

}  // namespace

LayerCache LayerCache::prefix(std::int64_t count) const
{
    const auto first = [&](const std::vector<float>& x) {
        const std::size_t row = positions > 0 ? x.size() / std::size_t(positions) : 0;
        return std::vector<float>(x.begin(), x.begin() + std::ptrdiff_t(row * std::size_t(count)));
    };
    LayerCache c;
    c.positions = count;
    c.k = first(k);
    c.v = first(v);
    c.values = first(values);
    c.capacity = count;
    c.keyChannels = keyChannels;
    c.keysByChannel.resize(keyChannels * std::size_t(count));
    for (std::size_t ch = 0; ch < keyChannels; ++ch)
        std::copy_n(keysByChannel.data() + ch * std::size_t(capacity), count,
                    c.keysByChannel.data() + ch * std::size_t(count));
    return c;
}

TinyTransformer::TinyTransformer(const ModelShape& shape, std::uint64_t seed)
    : m_shape(shape)
{
    detmath::NormalSampler normal(seed);
    const auto matrix = [&](int rows, int cols, double stddev) { return randomMatrix(normal, rows, cols, stddev); };
    const auto normWeight = [&](int size) {
        std::vector<float> w{};
        w.resize(std::size_t(size));
        for (float& x : w)
            x = float(1.0 + 0.1 * normal());
        return w;
    };
    const int h = shape.hidden, kv = shape.kvHeads * shape.headDim;
    const int q = shape.queryHeads * (shape.headDim + (shape.mla() ? shape.ropeHeadDim : 0));
    const int attended = shape.queryHeads * shape.headDim;
    m_fp32.embed = matrix(shape.vocab, h, 1.0);
    m_fp32.finalNorm = normWeight(h);
    // Logits spread like a trained model's: a few units between the top candidates.
    m_fp32.lmHead = matrix(h, shape.vocab, 2.0 / std::sqrt(double(h)));
    for (int l = 0; l < shape.layers; ++l) {
        Layer layer;
        layer.attnNorm = normWeight(h);
        layer.wq = matrix(h, q, 1.0 / std::sqrt(double(h)));
        if (shape.mla()) {
            const int r = shape.kvLoraRank;
            layer.wk = matrix(h, r + shape.ropeHeadDim, 1.0 / std::sqrt(double(h)));
            layer.kvNorm = normWeight(r);
            layer.wv = matrix(r, shape.queryHeads * 2 * shape.headDim, 1.0 / std::sqrt(double(r)));
            layer.wo = matrix(attended, h, 0.5 / std::sqrt(double(attended)));
            layer.mlpNorm = normWeight(h);
            layer.wGate = matrix(h, shape.ffn, 1.0 / std::sqrt(double(h)));
            layer.wUp = matrix(h, shape.ffn, 1.0 / std::sqrt(double(h)));
            layer.wDown = matrix(shape.ffn, h, 0.5 / std::sqrt(double(shape.ffn)));
            m_fp32.layers.push_back(std::move(layer));
            continue;
        }
        layer.wk = matrix(h, kv, 1.0 / std::sqrt(double(h)));
        // Trained K projections have a few channels with much larger magnitude.
        for (int head = 0; head < shape.kvHeads; ++head)
            for (int c : {1, shape.headDim / 2 + 1})
                for (int r = 0; r < h; ++r)
                    layer.wk.row(r)[head * shape.headDim + c] *= 6.0f;
        layer.wv = matrix(h, kv, 1.0 / std::sqrt(double(h)));
        layer.wo = matrix(q, h, 0.5 / std::sqrt(double(q)));
        if (std::find(shape.quietHeadLayers.begin(), shape.quietHeadLayers.end(), l) != shape.quietHeadLayers.end()) {
            // KV head 0 smaller by a power of two (exact in bf16); its query heads and their rows
            // of the output projection larger by as much.
            const float down = std::ldexp(1.0f, -shape.quietHeadOctaves), up = std::ldexp(1.0f, shape.quietHeadOctaves);
            const int group = shape.queryHeads / shape.kvHeads;
            for (int r = 0; r < h; ++r)
                for (int c = 0; c < shape.headDim; ++c) {
                    layer.wk.row(r)[c] *= down;
                    layer.wv.row(r)[c] *= down;
                    for (int g = 0; g < group; ++g)
                        layer.wq.row(r)[g * shape.headDim + c] *= up;
                }
            for (int g = 0; g < group; ++g)
                for (int c = 0; c < shape.headDim; ++c)
                    for (float& w : std::span(layer.wo.row(g * shape.headDim + c), std::size_t(h)))
                        w *= up;
        }
        layer.mlpNorm = normWeight(h);
        layer.wGate = matrix(h, shape.ffn, 1.0 / std::sqrt(double(h)));
        layer.wUp = matrix(h, shape.ffn, 1.0 / std::sqrt(double(h)));
        layer.wDown = matrix(shape.ffn, h, 0.5 / std::sqrt(double(shape.ffn)));
        m_fp32.layers.push_back(std::move(layer));
    }
    const auto rounded = [](auto x) {
        if constexpr (std::is_same_v<decltype(x), Matrix>)
            roundInPlace(x.values);
        else
            roundInPlace(x);
        return x;
    };
    m_bf16.embed = rounded(m_fp32.embed);
    m_bf16.finalNorm = rounded(m_fp32.finalNorm);
    m_bf16.lmHead = rounded(m_fp32.lmHead);
    for (const Layer& l : m_fp32.layers)
        m_bf16.layers.push_back({rounded(l.attnNorm), rounded(l.mlpNorm), rounded(l.wq), rounded(l.wk), rounded(l.wv),
                                 rounded(l.wo), rounded(l.wGate), rounded(l.wUp), rounded(l.wDown),
                                 rounded(l.kvNorm)});
    // Mamba2 layers: each mixer's weights from its own stream, so that the other layers' draws
    // are the same as without them.
    for (int l : shape.mambaLayers)
        m_mixers.emplace_back(shape.hidden, shape.mamba, seed * 1000003 + std::uint64_t(l) + 1);
    // HF: inv_freq = 1 / theta^(2i / dim) in fp32.
    const int rotary = shape.mla() ? shape.ropeHeadDim : shape.headDim;
    for (int i = 0; i < rotary / 2; ++i)
        m_invFreq.push_back(float(invFreq(i, rotary, shape.llama3Rope)));
}

void TinyTransformer::attention(const Matrix& q, const LayerCache& cache, std::int64_t start, int layer, Numerics n,
                                const EngineFaults& faults, Matrix& out, const LayerCache* own) const
{
    const ModelShape& s = m_shape;
    // MLA: every query head has its own key (headDim + ropeHeadDim) and value (headDim).
    const int dim = s.headDim + (s.mla() ? s.ropeHeadDim : 0), valueDim = s.headDim;
    const int keyHeads = s.mla() ? s.queryHeads : s.kvHeads, groupSize = s.queryHeads / keyHeads;
    const std::vector<float>& values = s.mla() ? cache.values : cache.v;
    const float scale = 1.0f / std::sqrt(float(dim));
    const bool engine = n == Numerics::Engine;
    const int window = s.window - (engine && faults.windowOffByOne ? 1 : 0);
    std::vector<float> scores, weights;
    for (int i = 0; i < q.rows; ++i) {
        const std::int64_t pos = start + i;
        const std::int64_t first = !sliding(layer) ? 0
                                   : s.chunked ? pos / window * window  // windowOffByOne: chunks one too short
                                               : std::max<std::int64_t>(0, pos - window + 1);
        const std::size_t count = std::size_t(pos - first + 1);
        // With `own`, the row's own position is read from there (its row i), the rest from the cache.
        const std::size_t fromCache = own ? count - 1 : count;
        for (int h = 0; h < s.queryHeads; ++h) {
            const int kvHead = h / groupSize;
            const float* query = q.row(i) + std::size_t(h) * std::size_t(dim);
            // Scores in fp32, summed over channels in order (vectorised across positions).
            scores.assign(count, 0.0f);
            for (int d = 0; d < dim; ++d) {
                const float qd = query[d];
                const std::size_t channel = std::size_t(kvHead) * std::size_t(dim) + std::size_t(d);
                const float* keys = cache.keysByChannel.data() + channel * std::size_t(cache.capacity) + std::size_t(first);
                for (std::size_t j = 0; j < fromCache; ++j)
                    scores[j] += qd * keys[j];
                if (own)
                    scores[count - 1] += qd * own->keysByChannel[channel * std::size_t(own->capacity) + std::size_t(i)];
            }
            for (float& x : scores)  // HF eager: a bf16 matmul output, scaled in bf16
                x = n == Numerics::Expected ? roundToBf16(roundToBf16(x) * scale) : x * scale;
            const float top = *std::max_element(scores.begin(), scores.end());
            weights.resize(count);
            float sum = 0;
            for (std::size_t j = 0; j < count; ++j) {
                weights[j] = float(detmath::exp(double(scores[j] - top)));
                sum += weights[j];
            }
            float* o = out.row(i) + std::size_t(h) * std::size_t(valueDim);
            std::fill_n(o, valueDim, 0.0f);
            // Baseline and HF normalise the weights first (HF then casts them to bf16); a flash
            // kernel casts the unnormalised weights to bf16 and divides the output by the sum.
            for (float& w : weights)
                w = n == Numerics::Baseline ? w / sum : n == Numerics::Expected ? roundToBf16(w / sum) : roundToBf16(w);
            for (std::size_t j = 0; j < count; ++j) {
                const float w = weights[j];
                const float* value =
                    j < fromCache ? values.data() + (std::size_t(first + std::int64_t(j)) * std::size_t(keyHeads) +
                                                     std::size_t(kvHead)) * std::size_t(valueDim)
                                  : (s.mla() ? own->values : own->v).data() +
                                        (std::size_t(i) * std::size_t(keyHeads) + std::size_t(kvHead)) * std::size_t(valueDim);
                for (int d = 0; d < valueDim; ++d)
                    o[d] += w * value[d];
            }
            if (engine)
                for (int d = 0; d < valueDim; ++d)
                    o[d] = roundToBf16(o[d] / sum);
            else if (n == Numerics::Expected)
                for (int d = 0; d < valueDim; ++d)
                    o[d] = roundToBf16(o[d]);
        }
    }
}

void TinyTransformer::latentAttentionKv(const Layer& layer, const Matrix& h, Matrix& q, std::int64_t start, int l,
                                        Numerics numerics, const EngineFaults& faults, std::int64_t promptLen,
                                        LayerCache& cache) const
{
    const ModelShape& s = m_shape;
    const int n = h.rows, r = s.kvLoraRank, ropeDim = s.ropeHeadDim, hd = s.headDim, key = hd + ropeDim;
    const bool engine = numerics == Numerics::Engine;
    const Matrix kvA = linear(h, layer.wk, numerics);  // kv_a_proj_with_mqa: [latent | k_pe]
    Matrix latent(n, r), kPe(n, ropeDim);
    for (int i = 0; i < n; ++i) {
        std::copy_n(kvA.row(i), r, latent.row(i));
        std::copy_n(kvA.row(i) + r, ropeDim, kPe.row(i));
    }
    const Matrix cKv = rmsNorm(latent, layer.kvNorm, numerics);  // kv_a_layernorm
    for (int i = 0; i < n; ++i) {
        const std::int64_t pos = start + i;
        if (engine && faults.ropeApplies(l, pos)) {
            for (int head = 0; head < s.queryHeads; ++head)
                faultyRope(q.row(i) + std::size_t(head * key + hd), 1, ropeDim, pos, faults, s.llama3Rope);
            faultyRope(kPe.row(i), 1, ropeDim, pos, faults, s.llama3Rope);
            continue;
        }
        for (int head = 0; head < s.queryHeads; ++head)
            rope(q.row(i) + std::size_t(head * key + hd), 1, ropeDim, pos, m_invFreq, numerics);
        const bool offset = engine && l == faults.ropeOffsetLayer && pos >= promptLen;
        rope(kPe.row(i), 1, ropeDim, pos + (offset ? 1 : 0), m_invFreq, numerics);
    }
    appendLatent(layer, cKv, kPe, numerics, cache);
}

void TinyTransformer::appendLatent(const Layer& layer, const Matrix& cKv, const Matrix& kPe, Numerics numerics,
                                   LayerCache& cache) const
{
    const ModelShape& s = m_shape;
    const int n = cKv.rows, ropeDim = s.ropeHeadDim, hd = s.headDim, key = hd + ropeDim;
    // kv_b_proj: each head's K (no rotary part) and V from the latent.
    const Matrix up = linear(cKv, layer.wv, numerics);
    Matrix keys(n, s.queryHeads * key), values(n, s.queryHeads * hd);
    for (int i = 0; i < n; ++i)
        for (int head = 0; head < s.queryHeads; ++head) {
            const float* own = up.row(i) + std::size_t(head * 2 * hd);
            std::copy_n(own, hd, keys.row(i) + std::size_t(head * key));
            std::copy_n(kPe.row(i), ropeDim, keys.row(i) + std::size_t(head * key + hd));
            std::copy_n(own + hd, hd, values.row(i) + std::size_t(head * hd));
        }
    appendRows(cache.k, cKv);
    appendRows(cache.v, kPe);
    appendRows(cache.values, values);
    appendKeys(cache, keys);
}

Matrix TinyTransformer::attentionBlock(const Layer& layer, const Matrix& h, std::int64_t start, int l, LayerCache& c,
                                       Numerics numerics, const EngineFaults& faults, std::int64_t promptLen,
                                       PastRead read) const
{
    const ModelShape& s = m_shape;
    const int n = h.rows;
    const bool engine = numerics == Numerics::Engine;
    Matrix q = linear(h, layer.wq, numerics);
    if (s.mla())
        latentAttentionKv(layer, h, q, start, l, numerics, faults, promptLen, c);
    else {
        Matrix k = linear(h, layer.wk, numerics);
        const Matrix v = [&] {
            Matrix m = linear(h, layer.wv, numerics);
            for (int i = 0; i < n; ++i) {
                const std::int64_t pos = start + i;
                if (engine && l == faults.biasLayer)
                    for (int d = 0; d < s.headDim; ++d) {
                        const std::size_t at = std::size_t(faults.biasHead * s.headDim + d);
                        k.row(i)[at] = roundToBf16(k.row(i)[at] + faults.biasK[std::size_t(d)]);
                        m.row(i)[at] = roundToBf16(m.row(i)[at] + faults.biasV[std::size_t(d)]);
                    }
                if (engine && faults.ropeApplies(l, pos)) {
                    faultyRope(q.row(i), s.queryHeads, s.headDim, pos, faults, s.llama3Rope);
                    faultyRope(k.row(i), s.kvHeads, s.headDim, pos, faults, s.llama3Rope);
                } else {
                    rope(q.row(i), s.queryHeads, s.headDim, pos, m_invFreq, numerics);
                    const bool offset = engine && l == faults.ropeOffsetLayer && pos >= promptLen;
                    rope(k.row(i), s.kvHeads, s.headDim, pos + (offset ? 1 : 0), m_invFreq, numerics);
                }
                if (engine && l == faults.deadLayer && pos >= faults.deadFrom) {
                    std::fill_n(k.row(i) + std::size_t(faults.deadHead) * std::size_t(s.headDim), s.headDim, 0.0f);
                    std::fill_n(m.row(i) + std::size_t(faults.deadHead) * std::size_t(s.headDim), s.headDim, 0.0f);
                }
            }
            return m;
        }();
        appendRows(c.k, k);
        appendRows(c.v, v);
        appendKeys(c, k);
    }
    Matrix attended(n, s.queryHeads * s.headDim);
    if (read.past)  // a decode step reading a cache: `c` holds only the rows' own K and V
        attention(q, *read.past, start, l, numerics, faults, attended, read.whole ? nullptr : &c);
    else
        attention(q, c, start, l, numerics, faults, attended);
    return linear(attended, layer.wo, numerics);
}

Matrix TinyTransformer::mamba(int l, const Matrix& h, std::int64_t start, LayerCache& c, Numerics n,
                              const EngineFaults& faults) const
{
    const Mamba2Mixer& mixer = mixerOf(l);
    if (c.positions == 0)
        c.state = mixer.initialState();
    appendRows(c.mixerInputs, h);
    const bool faulty = n == Numerics::Engine && faults.stateFault != EngineFaults::StateFault::None && faults.stateLayer == l;
    const std::int64_t every = m_shape.mambaCheckpointEvery;
    Matrix out = mixer.forward(h, c.state, n, [&](int row, Mamba2State& state) {
        const std::int64_t count = start + row + 1;
        if (faulty && count == faults.stateAt)
            applyStateFault(faults, c, mixer.shape(), state);
        if (every > 0 && count % every == 0)
            c.checkpoints.push_back({count, state});
    });
    c.positions = start + h.rows;
    return out;
}

const Mamba2Mixer& TinyTransformer::mixerOf(int layer) const
{
    const auto at = std::find(m_shape.mambaLayers.begin(), m_shape.mambaLayers.end(), layer);
    return m_mixers[std::size_t(at - m_shape.mambaLayers.begin())];
}

Mamba2State TinyTransformer::stateAfter(const LayerCache& cache, int layer, std::int64_t count, Numerics numerics,
                                        const EngineFaults& faults) const
{
    if (count == cache.positions)
        return cache.state;
    if (count > cache.positions || count < 0)
        throw std::logic_error("a Mamba2 state after " + std::to_string(count) + " positions of " +
                               std::to_string(cache.positions));
    // From the last checkpoint at or before `count` (or the start), the same inputs again; of the
    // earlier checkpoints only the one a stale-state fault reads.
    LayerCache c;
    const LayerCache::Checkpoint* from = nullptr;
    for (const LayerCache::Checkpoint& k : cache.checkpoints) {
        if (k.positions > count)
            break;  // in increasing order
        if (faults.stateFault == EngineFaults::StateFault::Stale && k.positions == faults.stateSource)
            c.checkpoints.push_back(k);
        from = &k;
    }
    if (from) {
        c.state = from->state;
        c.positions = from->positions;
    }
    const int hidden = m_shape.hidden;
    Matrix h(int(count - c.positions), hidden);
    std::copy_n(cache.mixerInputs.begin() + std::ptrdiff_t(c.positions * hidden), h.values.size(), h.values.begin());
    mamba(layer, h, c.positions, c, numerics, faults);
    return c.state;
}

std::vector<LayerCache> TinyTransformer::prefix(const std::vector<LayerCache>& cache, std::int64_t count, Numerics numerics,
                                                const EngineFaults& faults) const
{
    std::vector<LayerCache> out;
    for (int l = 0; l < int(cache.size()); ++l) {
        const LayerCache& c = cache[std::size_t(l)];
        if (!m_shape.isMamba(l)) {
            out.push_back(c.prefix(count));
            continue;
        }
        LayerCache p;
        p.positions = count;
        p.state = stateAfter(c, l, count, numerics, faults);
        p.mixerInputs.assign(c.mixerInputs.begin(), c.mixerInputs.begin() + std::ptrdiff_t(count * m_shape.hidden));
        for (const LayerCache::Checkpoint& k : c.checkpoints)
            if (k.positions <= count)
                p.checkpoints.push_back(k);
        out.push_back(std::move(p));
    }
    return out;
}

Matrix TinyTransformer::forward(const std::vector<std::int64_t>& tokens, std::int64_t start, std::vector<LayerCache>& cache,
                                Numerics numerics, const EngineFaults& faults, std::int64_t promptLen,
                                std::vector<Matrix>* residuals) const
{
    const ModelShape& s = m_shape;
    const Weights& w = weightsFor(numerics);
    const int n = int(tokens.size());
    if (cache.empty())
        cache.resize(std::size_t(s.layers));
    Matrix x(n, s.hidden);
    for (int i = 0; i < n; ++i)
        std::copy_n(w.embed.row(int(tokens[std::size_t(i)])), s.hidden, x.row(i));
    for (int l = 0; l < s.layers; ++l) {
        if (residuals)
            residuals->push_back(x);
        runLayer(l, x, start, cache[std::size_t(l)], numerics, faults, promptLen, {});
    }
    return linear(rmsNorm(x, w.finalNorm, numerics), w.lmHead, numerics);
}

Matrix TinyTransformer::decodeSteps(Matrix residual, std::int64_t first, int firstLayer,
                                    const std::vector<PastRead>& reads, Numerics numerics) const
{
    const Weights& w = weightsFor(numerics);
    for (int l = firstLayer; l < m_shape.layers; ++l) {
        LayerCache own;  // the rows' own K and V (or a Mamba2 layer's nothing)
        runLayer(l, residual, first, own, numerics, {}, 0, reads[std::size_t(l)]);
    }
    return linear(rmsNorm(residual, w.finalNorm, numerics), w.lmHead, numerics);
}

LayerCache TinyTransformer::cacheOf(int l, const Matrix& k, const Matrix& v, Numerics numerics) const
{
    LayerCache c;
    if (m_shape.mla()) {
        appendLatent(weightsFor(numerics).layers[std::size_t(l)], k, v, numerics, c);
        return c;
    }
    appendRows(c.k, k);
    appendRows(c.v, v);
    appendKeys(c, k);
    return c;
}

void TinyTransformer::runLayer(int l, Matrix& x, std::int64_t start, LayerCache& c, Numerics numerics,
                               const EngineFaults& faults, std::int64_t promptLen, PastRead read) const
{
    const Layer& layer = weightsFor(numerics).layers[std::size_t(l)];
    const bool bf16 = numerics != Numerics::Baseline;
    const auto addResidual = [&](const Matrix& y) {
        for (std::size_t i = 0; i < x.values.size(); ++i)
            x.values[i] = bf16 ? roundToBf16(x.values[i] + y.values[i]) : x.values[i] + y.values[i];
    };
    const Matrix h = rmsNorm(x, layer.attnNorm, numerics);
    if (!m_shape.isMamba(l))
        addResidual(attentionBlock(layer, h, start, l, c, numerics, faults, promptLen, read));
    else if (!read.past)
        addResidual(mamba(l, h, start, c, numerics, faults));
    else
        addResidual(mambaSteps(l, h, start, *read.past, numerics));
    const Matrix m = rmsNorm(x, layer.mlpNorm, numerics);
    const Matrix gate = linear(m, layer.wGate, numerics);
    Matrix act = linear(m, layer.wUp, numerics);
    for (std::size_t i = 0; i < act.values.size(); ++i) {
        const float g = silu(gate.values[i]), up = act.values[i];
        switch (numerics) {
        case Numerics::Baseline: act.values[i] = g * up; break;
        case Numerics::Expected: act.values[i] = roundToBf16(roundToBf16(g) * up); break;  // silu, then mul
        case Numerics::Engine: act.values[i] = roundToBf16(g * up); break;                 // fused silu-and-mul
        }
    }
    addResidual(linear(act, layer.wDown, numerics));
}

Matrix TinyTransformer::mambaSteps(int l, const Matrix& h, std::int64_t start, const LayerCache& past, Numerics n) const
{
    const Mamba2Mixer& mixer = mixerOf(l);
    Matrix out(h.rows, m_shape.hidden);
    Matrix row(1, h.cols);
    for (int i = 0; i < h.rows; ++i) {
        Mamba2State state = stateAfter(past, l, start + i, n);
        std::copy_n(h.row(i), h.cols, row.row(0));
        const Matrix y = mixer.forward(row, state, n);
        std::copy_n(y.row(0), m_shape.hidden, out.row(i));
    }
    return out;
}

}  // namespace kvscope::synth
