#include "tiny_transformer.h"

#include <cmath>

namespace kvscope::synth {

namespace {

torch::Tensor toBf16Values(const torch::Tensor& x)
{
    return x.to(torch::kBFloat16).to(torch::kFloat32);
}

torch::Tensor store(const torch::Tensor& x, Numerics n)
{
    return n == Numerics::Baseline ? x : toBf16Values(x);
}

}  // namespace

TinyTransformer::TinyTransformer(const ModelShape& shape, std::uint64_t seed)
    : m_shape(shape)
{
    torch::manual_seed(seed);
    const auto normal = [](std::initializer_list<std::int64_t> size, double std) {
        return torch::randn(size, torch::kFloat32) * std;
    };
    const int h = shape.hidden, q = shape.queryHeads * shape.headDim, kv = shape.kvHeads * shape.headDim;
    m_fp32.embed = normal({shape.vocab, h}, 1.0);
    m_fp32.finalNorm = 1.0 + normal({h}, 0.1);
    // Logits spread like a trained model's: a few units between the top candidates.
    m_fp32.lmHead = normal({h, shape.vocab}, 2.0 / std::sqrt(double(h)));
    for (int l = 0; l < shape.layers; ++l) {
        Layer layer;
        layer.attnNorm = 1.0 + normal({h}, 0.1);
        layer.wq = normal({h, q}, 1.0 / std::sqrt(double(h)));
        layer.wk = normal({h, kv}, 1.0 / std::sqrt(double(h)));
        // Trained K projections have a few channels with much larger magnitude.
        for (int head = 0; head < shape.kvHeads; ++head)
            for (int c : {1, shape.headDim / 2 + 1})
                layer.wk.select(1, head * shape.headDim + c).mul_(6.0);
        layer.wv = normal({h, kv}, 1.0 / std::sqrt(double(h)));
        layer.wo = normal({q, h}, 0.5 / std::sqrt(double(q)));
        layer.mlpNorm = 1.0 + normal({h}, 0.1);
        layer.wGate = normal({h, shape.ffn}, 1.0 / std::sqrt(double(h)));
        layer.wUp = normal({h, shape.ffn}, 1.0 / std::sqrt(double(h)));
        layer.wDown = normal({shape.ffn, h}, 0.5 / std::sqrt(double(shape.ffn)));
        m_fp32.layers.push_back(layer);
    }
    m_bf16.embed = toBf16Values(m_fp32.embed);
    m_bf16.finalNorm = toBf16Values(m_fp32.finalNorm);
    m_bf16.lmHead = toBf16Values(m_fp32.lmHead);
    for (const Layer& l : m_fp32.layers)
        m_bf16.layers.push_back({toBf16Values(l.attnNorm), toBf16Values(l.wq), toBf16Values(l.wk), toBf16Values(l.wv),
                                 toBf16Values(l.wo), toBf16Values(l.mlpNorm), toBf16Values(l.wGate),
                                 toBf16Values(l.wUp), toBf16Values(l.wDown)});
}

const TinyTransformer::Weights& TinyTransformer::weightsFor(Numerics n) const
{
    return n == Numerics::Baseline ? m_fp32 : m_bf16;
}

torch::Tensor TinyTransformer::linear(const torch::Tensor& x, const torch::Tensor& w, Numerics n) const
{
    switch (n) {
    case Numerics::Baseline:
        return x.matmul(w);
    case Numerics::Expected:  // a bf16 GEMM (oneDNN), its output bf16
        return x.to(torch::kBFloat16).matmul(w.to(torch::kBFloat16)).to(torch::kFloat32);
    case Numerics::Engine:  // exact products accumulated in fp32 in another order, rounded once
        return toBf16Values(x.matmul(w));
    }
    return x;
}

torch::Tensor TinyTransformer::rmsNorm(const torch::Tensor& x, const torch::Tensor& w, Numerics n) const
{
    const torch::Tensor normed = x * torch::rsqrt(x.pow(2).mean(-1, true) + 1e-6);
    switch (n) {
    case Numerics::Baseline:
        return normed * w;
    case Numerics::Expected:  // HF: normalise in fp32, cast to bf16, then times the weight
        return toBf16Values(toBf16Values(normed) * w);
    case Numerics::Engine:  // fp32 normalisation with the weight, one rounding
        return toBf16Values(normed * w);
    }
    return normed;
}

torch::Tensor TinyTransformer::rope(const torch::Tensor& x, const torch::Tensor& positions, Numerics n) const
{
    // x: [t, heads, dim]; rotate-half convention, theta 10000, angles in fp32.
    const int half = m_shape.headDim / 2;
    const torch::Tensor invFreq =
        torch::pow(10000.0, -torch::arange(0, half, torch::kFloat32) * 2.0 / double(m_shape.headDim));
    const torch::Tensor angles = positions.to(torch::kFloat32).unsqueeze(1) * invFreq.unsqueeze(0);  // [t, half]
    torch::Tensor cos = torch::cat({angles.cos(), angles.cos()}, -1).unsqueeze(1);
    torch::Tensor sin = torch::cat({angles.sin(), angles.sin()}, -1).unsqueeze(1);
    if (n == Numerics::Expected) {  // HF casts cos/sin to the model dtype
        cos = toBf16Values(cos);
        sin = toBf16Values(sin);
    }
    const torch::Tensor rotated = torch::cat({-x.slice(-1, half), x.slice(-1, 0, half)}, -1);
    return store(x * cos + rotated * sin, n);
}

torch::Tensor TinyTransformer::forward(const std::vector<std::int64_t>& tokens, std::int64_t start,
                                       std::vector<LayerCache>& cache, Numerics numerics, const EngineFaults& faults,
                                       std::int64_t promptLen) const
{
    torch::NoGradGuard noGrad;
    const ModelShape& s = m_shape;
    const Weights& w = weightsFor(numerics);
    const std::int64_t n = std::int64_t(tokens.size());
    const bool engine = numerics == Numerics::Engine;
    if (cache.empty())
        cache.resize(std::size_t(s.layers));

    const torch::Tensor ids = torch::tensor(tokens, torch::kInt64);
    torch::Tensor x = w.embed.index_select(0, ids);  // [n, hidden]
    const torch::Tensor positions = torch::arange(start, start + n, torch::kInt64);
    const std::int64_t ctx = start + n;
    const torch::Tensor keyPos = torch::arange(0, ctx, torch::kInt64);
    const int groupSize = s.queryHeads / s.kvHeads;

    for (int l = 0; l < s.layers; ++l) {
        const Layer& layer = w.layers[std::size_t(l)];
        const torch::Tensor h = rmsNorm(x, layer.attnNorm, numerics);
        torch::Tensor q = linear(h, layer.wq, numerics).view({n, s.queryHeads, s.headDim});
        torch::Tensor k = linear(h, layer.wk, numerics).view({n, s.kvHeads, s.headDim});
        torch::Tensor v = linear(h, layer.wv, numerics).view({n, s.kvHeads, s.headDim});
        q = rope(q, positions, numerics);
        torch::Tensor kPositions = positions;
        if (engine && l == faults.ropeOffsetLayer)
            kPositions = positions + (positions >= promptLen).to(torch::kInt64);
        k = rope(k, kPositions, numerics);
        if (engine && l == faults.deadLayer) {
            const torch::Tensor dead = (positions >= faults.deadFrom).to(torch::kFloat32).view({n, 1});
            k.select(1, faults.deadHead).mul_(1 - dead);
            v.select(1, faults.deadHead).mul_(1 - dead);
        }
        LayerCache& c = cache[std::size_t(l)];
        const torch::Tensor kNew = k.permute({1, 0, 2}).contiguous();  // [kvHeads, n, dim]
        const torch::Tensor vNew = v.permute({1, 0, 2}).contiguous();
        c.k = c.k.defined() ? torch::cat({c.k, kNew}, 1) : kNew;
        c.v = c.v.defined() ? torch::cat({c.v, vNew}, 1) : vNew;

        // Attention over [0, ctx), causal, windowed on sliding layers.
        const torch::Tensor keys = c.k.repeat_interleave(groupSize, 0);    // [qHeads, ctx, dim]
        const torch::Tensor values = c.v.repeat_interleave(groupSize, 0);
        const torch::Tensor queries = q.permute({1, 0, 2});                 // [qHeads, n, dim]
        torch::Tensor scores;
        if (numerics == Numerics::Expected)
            scores = queries.to(torch::kBFloat16).matmul(keys.to(torch::kBFloat16).transpose(1, 2)).to(torch::kFloat32);
        else
            scores = store(queries.matmul(keys.transpose(1, 2)), numerics);
        scores = scores / std::sqrt(double(s.headDim));
        const torch::Tensor distance = positions.unsqueeze(1) - keyPos.unsqueeze(0);  // [n, ctx]
        torch::Tensor allowed = distance >= 0;
        if (sliding(l)) {
            const int window = s.window - (engine && faults.windowOffByOne ? 1 : 0);
            allowed = allowed & (distance < window);
        }
        scores = scores.masked_fill(allowed.logical_not().unsqueeze(0), -std::numeric_limits<float>::infinity());
        const torch::Tensor probs = store(torch::softmax(scores, -1), numerics);
        torch::Tensor attended;
        if (numerics == Numerics::Expected)
            attended = probs.to(torch::kBFloat16).matmul(values.to(torch::kBFloat16)).to(torch::kFloat32);
        else
            attended = store(probs.matmul(values), numerics);
        attended = attended.permute({1, 0, 2}).reshape({n, s.queryHeads * s.headDim});
        x = store(x + linear(attended, layer.wo, numerics), numerics);

        const torch::Tensor m = rmsNorm(x, layer.mlpNorm, numerics);
        const torch::Tensor gate = linear(m, layer.wGate, numerics);
        const torch::Tensor up = linear(m, layer.wUp, numerics);
        const torch::Tensor act = store(torch::silu(gate) * up, numerics);
        x = store(x + linear(act, layer.wDown, numerics), numerics);
    }
    return linear(rmsNorm(x, w.finalNorm, numerics), w.lmHead, numerics);
}

}  // namespace kvscope::synth
