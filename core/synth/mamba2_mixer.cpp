#include "synth/mamba2_mixer.h"

#include "util/deterministic_math.h"

#include <cmath>
#include <stdexcept>
#include <string>

namespace kvscope::synth {

namespace {

using detmath::roundToBf16;

constexpr float kNormEpsilon = 1e-5f;  // HF Mamba2Config's layer_norm_epsilon

// log(1 + e^x), as torch's softplus (threshold 20: x itself above it).
float softplus(float x)
{
    return x > 20.0f ? x : float(detmath::log(1.0 + detmath::exp(double(x))));
}

// Mamba2's dt initialisation: log-spaced from 0.001 to 0.1 over the heads, each head's dt_bias
// its inverse softplus (dt + log(1 - e^-dt)); A from 1 to 16, spread by the golden ratio so that
// slow and fast heads mix.
void initialiseDynamics(Mamba2Mixer::Weights& w, int heads)
{
    const double lo = detmath::log(0.001), hi = detmath::log(0.1);
    for (int h = 0; h < heads; ++h) {
        const double dt = detmath::exp(lo + (hi - lo) * (h + 0.5) / heads);
        w.dtBias.push_back(float(dt + detmath::log(1.0 - detmath::exp(-dt))));
        const double u = (h + 1) * 0.6180339887498949;
        w.aLog.push_back(float(detmath::log(1.0 + 15.0 * (u - std::floor(u)))));
    }
}

Mamba2Mixer::Weights rounded(Mamba2Mixer::Weights w)
{
    for (std::vector<float>* v : {&w.inProj.values, &w.conv.values, &w.convBias, &w.dtBias, &w.aLog, &w.d, &w.norm,
                                  &w.outProj.values})
        roundInPlace(*v);
    return w;
}

void checkShape(const Mamba2Shape& s)
{
    if (s.heads < 1 || s.headDim < 1 || s.stateSize < 1 || s.groups < 1 || s.convWidth < 1 || s.heads % s.groups != 0)
        throw std::invalid_argument("a Mamba2 mixer needs positive sizes and heads a multiple of the groups (heads " +
                                    std::to_string(s.heads) + ", groups " + std::to_string(s.groups) + ")");
}

}  // namespace

Mamba2Mixer::Mamba2Mixer(int hidden, const Mamba2Shape& shape, std::uint64_t seed)
    : m_shape(shape)
{
    checkShape(shape);
    detmath::NormalSampler normal(seed);
    const auto matrix = [&](int rows, int cols, double stddev) { return randomMatrix(normal, rows, cols, stddev); };
    const auto around = [&](int size, double centre, double stddev) {
        std::vector<float> v(static_cast<std::size_t>(size));
        for (float& x : v)
            x = float(centre + stddev * normal());
        return v;
    };
    const int inner = shape.inner(), convDim = shape.convDim();
    m_fp32.inProj = matrix(hidden, inner + convDim + shape.heads, 1.0 / std::sqrt(double(hidden)));
    m_fp32.conv = matrix(convDim, shape.convWidth, 1.0 / std::sqrt(double(shape.convWidth)));
    m_fp32.convBias = around(convDim, 0.0, 0.1);
    m_fp32.d = around(shape.heads, 1.0, 0.1);
    m_fp32.norm = around(inner, 1.0, 0.1);
    m_fp32.outProj = matrix(inner, hidden, 0.5 / std::sqrt(double(inner)));
    initialiseDynamics(m_fp32, shape.heads);
    m_bf16 = rounded(m_fp32);
}

Mamba2Mixer::Mamba2Mixer(const Mamba2Shape& shape, Weights fp32)
    : m_shape(shape), m_fp32(std::move(fp32))
{
    checkShape(shape);
    m_bf16 = rounded(m_fp32);
}

Mamba2State Mamba2Mixer::initialState() const
{
    const Mamba2Shape& s = m_shape;
    Mamba2State state;
    state.conv.assign(std::size_t(s.convDim()) * std::size_t(s.convWidth - 1), 0.0f);
    state.ssm.assign(std::size_t(s.heads) * std::size_t(s.headDim) * std::size_t(s.stateSize), 0.0f);
    return state;
}

// Rounding, by numerics (docs/synth.md): the baseline in fp32; "expected" as HF's eager bf16
// code, every tensor op's result bf16 (its SSM state too: HF's cache is in the model's dtype);
// the engine as vLLM's kernels, fp32 inside each kernel and bf16 between them (the SSM state
// fp32, or bf16 with engineStateBf16).
Matrix Mamba2Mixer::forward(const Matrix& h, Mamba2State& state, Numerics n, const AfterToken& afterToken) const
{
    const Mamba2Shape& s = m_shape;
    const Weights& w = weights(n);
    const bool expected = n == Numerics::Expected, baseline = n == Numerics::Baseline;
    const bool stateBf16 = expected || (n == Numerics::Engine && s.engineStateBf16);
    const auto eager = [expected](float x) { return expected ? roundToBf16(x) : x; };  // an HF op's bf16 result
    const auto kernel = [baseline](float x) { return baseline ? x : roundToBf16(x); };  // a kernel's bf16 output
    const int inner = s.inner(), convDim = s.convDim(), past = s.convWidth - 1, N = s.stateSize, P = s.headDim;
    const int headsPerGroup = s.heads / s.groups, groupWidth = inner / s.groups;
    if (state.conv.size() != std::size_t(convDim) * std::size_t(past) ||
        state.ssm.size() != std::size_t(s.heads) * std::size_t(P) * std::size_t(N))
        throw std::invalid_argument("Mamba2 state of the wrong size");

    std::vector<float> a(std::size_t(s.heads));  // A = -exp(A_log), fp32
    for (int head = 0; head < s.heads; ++head)
        a[std::size_t(head)] = -float(detmath::exp(double(w.aLog[std::size_t(head)])));

    const Matrix proj = linear(h, w.inProj, n);  // [z | xBC | dt]
    Matrix y(h.rows, inner);
    std::vector<float> xbc(static_cast<std::size_t>(convDim)), dt(static_cast<std::size_t>(s.heads));
    for (int t = 0; t < h.rows; ++t) {
        const float* z = proj.row(t);
        const float* in = z + inner;
        const float* dtRaw = in + convDim;
        // The causal convolution over [the state's inputs, oldest first; this token's], then SiLU;
        // the state drops its oldest input and takes this one.
        for (int c = 0; c < convDim; ++c) {
            const float* wc = w.conv.row(c);
            float* kept = state.conv.data() + std::size_t(c) * std::size_t(past);
            float acc = 0;
            for (int k = 0; k < past; ++k)
                acc += eager(wc[k] * kept[k]);
            acc += eager(wc[past] * in[c]);
            const float pre = expected ? roundToBf16(roundToBf16(acc) + w.convBias[std::size_t(c)]) : acc + w.convBias[std::size_t(c)];
            xbc[std::size_t(c)] = kernel(silu(pre));
            for (int k = 0; k + 1 < past; ++k)
                kept[k] = kept[k + 1];
            if (past > 0)
                kept[past - 1] = in[c];
        }
        for (int head = 0; head < s.heads; ++head) {
            const float v = dtRaw[head] + w.dtBias[std::size_t(head)];
            dt[std::size_t(head)] = expected ? roundToBf16(softplus(roundToBf16(v))) : softplus(v);
        }
        // The recurrence, per head, channel and state dimension; y = state . C + D x.
        const float* x = xbc.data();
        const float* B = x + inner;
        const float* C = B + s.groups * N;
        float* out = y.row(t);
        for (int head = 0; head < s.heads; ++head) {
            const int g = head / headsPerGroup;
            const float step = dt[std::size_t(head)];
            const float decay = float(detmath::exp(double(step * a[std::size_t(head)])));
            const float dScale = w.d[std::size_t(head)];
            for (int p = 0; p < P; ++p) {
                const float xv = x[head * P + p];
                float* st = state.ssm.data() + (std::size_t(head) * std::size_t(P) + std::size_t(p)) * std::size_t(N);
                float acc = 0;
                for (int i = 0; i < N; ++i) {
                    const float input = eager(eager(step * B[g * N + i]) * xv);  // (dt B) x
                    const float next = st[i] * decay + input;
                    st[i] = stateBf16 ? roundToBf16(next) : next;
                    acc += st[i] * C[g * N + i];
                }
                out[head * P + p] = expected ? roundToBf16(roundToBf16(acc) + roundToBf16(dScale * xv))
                                             : kernel(acc + dScale * xv);
            }
        }
        // Gated RMSNorm per group of channels (norm after the gate, as Mamba2), in fp32.
        for (int g = 0; g < s.groups; ++g) {
            float* yg = out + g * groupWidth;
            const float* zg = z + g * groupWidth;
            float squares = 0;
            for (int i = 0; i < groupWidth; ++i) {
                yg[i] = yg[i] * silu(zg[i]);
                squares += yg[i] * yg[i];
            }
            const float inverseRms = 1.0f / std::sqrt(squares / float(groupWidth) + kNormEpsilon);
            for (int i = 0; i < groupWidth; ++i) {
                const float normed = yg[i] * inverseRms, weight = w.norm[std::size_t(g * groupWidth + i)];
                yg[i] = baseline ? normed * weight : expected ? roundToBf16(roundToBf16(normed) * weight) : roundToBf16(normed * weight);
            }
        }
        if (afterToken)
            afterToken(t, state);
    }
    return linear(y, w.outProj, n);
}

}  // namespace kvscope::synth
