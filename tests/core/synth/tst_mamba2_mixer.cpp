// The synthetic hybrid model's Mamba2 mixer (synth/mamba2_mixer.h) against a double-precision
// Mamba2 written here from the published recurrence (Dao & Gu 2024, section 7; HF transformers'
// Mamba2Mixer.torch_forward with a cache): per token, in_proj -> (z, xBC, dt); a causal depthwise
// convolution of width d_conv over xBC (the state holding the last d_conv - 1 inputs, oldest
// first) and SiLU; x, B, C split from it; dt = softplus(dt + dt_bias); per head h of group g,
// state = exp(dt A) state + dt x B^T with A = -exp(A_log); y = state C + D x; y * silu(z), RMS
// normalised per group of channels (eps 1e-5) times the norm weight; out_proj. The weights are
// the mixer's own fp32 ones (inputs to both); everything computed from them is this file's.
// Plus a hand-worked case: one head, head_dim 1, d_state 1.

#include "synth/mamba2_mixer.h"
#include "synth/numerics.h"

#include <QTest>

#include <algorithm>
#include <cmath>
#include <random>

using namespace kvscope::synth;

namespace {

using Vec = std::vector<double>;

double softplus(double x)
{
    return x > 20 ? x : std::log1p(std::exp(x));
}
double silu(double x)
{
    return x / (1 + std::exp(-x));
}

// Mamba2 in double, one token at a time.
class ReferenceMamba2 {
public:
    ReferenceMamba2(const Mamba2Shape& s, const Mamba2Mixer::Weights& w, int hidden)
        : s(s), w(w), hidden(hidden), conv(std::size_t(s.convDim()) * std::size_t(s.convWidth - 1)),
          ssm(std::size_t(s.heads * s.headDim * s.stateSize))
    {
    }

    Vec step(const Vec& u)
    {
        const int inner = s.inner(), convDim = s.convDim(), past = s.convWidth - 1, N = s.stateSize, P = s.headDim;
        const int cols = w.inProj.cols;
        Vec proj(std::size_t(cols), 0.0);
        for (int j = 0; j < cols; ++j)
            for (int k = 0; k < hidden; ++k)
                proj[std::size_t(j)] += u[std::size_t(k)] * double(w.inProj.row(k)[j]);
        Vec xbc(static_cast<std::size_t>(convDim));
        for (int c = 0; c < convDim; ++c) {
            const double in = proj[std::size_t(inner + c)];
            double acc = double(w.convBias[std::size_t(c)]) + double(w.conv.row(c)[past]) * in;
            for (int k = 0; k < past; ++k)
                acc += double(w.conv.row(c)[k]) * conv[std::size_t(c * past + k)];
            xbc[std::size_t(c)] = silu(acc);
            for (int k = 0; k + 1 < past; ++k)
                conv[std::size_t(c * past + k)] = conv[std::size_t(c * past + k + 1)];
            if (past > 0)
                conv[std::size_t(c * past + past - 1)] = in;
        }
        Vec y(static_cast<std::size_t>(inner));
        for (int h = 0; h < s.heads; ++h) {
            const int g = h / (s.heads / s.groups);
            const double dt = softplus(proj[std::size_t(inner + convDim + h)] + double(w.dtBias[std::size_t(h)]));
            const double decay = std::exp(-dt * std::exp(double(w.aLog[std::size_t(h)])));
            for (int p = 0; p < P; ++p) {
                const double x = xbc[std::size_t(h * P + p)];
                double acc = 0;
                for (int n = 0; n < N; ++n) {
                    double& st = ssm[std::size_t((h * P + p) * N + n)];
                    st = decay * st + dt * x * xbc[std::size_t(inner + g * N + n)];
                    acc += st * xbc[std::size_t(inner + s.groups * N + g * N + n)];
                }
                y[std::size_t(h * P + p)] = acc + double(w.d[std::size_t(h)]) * x;
            }
        }
        const int width = inner / s.groups;
        for (int g = 0; g < s.groups; ++g) {
            double squares = 0;
            for (int i = g * width; i < (g + 1) * width; ++i) {
                y[std::size_t(i)] *= silu(proj[std::size_t(i)]);
                squares += y[std::size_t(i)] * y[std::size_t(i)];
            }
            const double inv = 1 / std::sqrt(squares / width + 1e-5);
            for (int i = g * width; i < (g + 1) * width; ++i)
                y[std::size_t(i)] *= inv * double(w.norm[std::size_t(i)]);
        }
        Vec out(std::size_t(hidden), 0.0);
        for (int j = 0; j < hidden; ++j)
            for (int i = 0; i < inner; ++i)
                out[std::size_t(j)] += y[std::size_t(i)] * double(w.outProj.row(i)[j]);
        return out;
    }

    const Mamba2Shape s;
    const Mamba2Mixer::Weights& w;
    const int hidden;
    Vec conv, ssm;
};

double relativeError(const std::vector<float>& got, const Vec& want)
{
    double err = 0, norm = 0;
    for (std::size_t i = 0; i < want.size(); ++i) {
        err += (double(got[i]) - want[i]) * (double(got[i]) - want[i]);
        norm += want[i] * want[i];
    }
    return std::sqrt(err / norm);
}

Mamba2Shape smallShape()
{
    Mamba2Shape s;
    s.heads = 4;
    s.headDim = 3;
    s.stateSize = 5;
    s.groups = 2;
    s.convWidth = 4;
    return s;
}

constexpr int kHidden = 12;
constexpr int kTokens = 48;

// Inputs like a normed hidden state: about unit size.
Matrix inputs(int rows, int cols, unsigned seed)
{
    std::mt19937 rng(seed);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    Matrix m(rows, cols);
    for (float& x : m.values)
        x = normal(rng);
    return m;
}

}  // namespace

class TestMamba2Mixer : public QObject {
    Q_OBJECT

private slots:
    // The fp32 path against the double reference: every output row and the state (conv and
    // SSM) after positions 1, 2, 3, 4, 5, 17 and 48. fp32 keeps 24 bits (2^-24 = 6e-8 a
    // rounding); an output row goes through sums of 12 and 24 products (in_proj, out_proj), the
    // norm and exp/log rounded to float, a few dozen roundings: 1e-6 relative would be loose for
    // one step. The SSM state is a decaying sum (|exp(dt A)| < 1: old errors shrink), each step
    // adding ~5 roundings, so after 48 steps at most ~250 x 6e-8 = 1.5e-5 in the worst case,
    // ~sqrt(250) x 6e-8 = 1e-6 typically; we allow 1e-5 relative (measured: 1e-6 on the outputs,
    // 4e-7 on the states). A wrong group, sign, order or index misses by 1e-3 or more.
    void fp32MatchesTheRecurrence()
    {
        const Mamba2Mixer mixer(kHidden, smallShape(), 11);
        ReferenceMamba2 ref(mixer.shape(), mixer.weights(Numerics::Baseline), kHidden);
        const Matrix h = inputs(kTokens, kHidden, 3);
        Mamba2State state = mixer.initialState();
        const std::vector<int> checked{1, 2, 3, 4, 5, 17, 48};
        std::vector<Mamba2State> kept;
        const Matrix out = mixer.forward(h, state, Numerics::Baseline, [&](int row, Mamba2State& s) {
            if (std::find(checked.begin(), checked.end(), row + 1) != checked.end())
                kept.push_back(s);
        });
        QCOMPARE(kept.size(), checked.size());
        std::size_t next = 0;
        double worstOut = 0, worstState = 0;
        for (int t = 0; t < kTokens; ++t) {
            const Vec want = ref.step(Vec(h.row(t), h.row(t) + kHidden));
            const double outErr = relativeError(std::vector<float>(out.row(t), out.row(t) + kHidden), want);
            worstOut = std::max(worstOut, outErr);
            QVERIFY2(outErr < 1e-5, qPrintable(QString("output row %1: relative error %2").arg(t).arg(outErr)));
            if (next < checked.size() && checked[next] == t + 1) {
                const double convErr = relativeError(kept[next].conv, ref.conv);
                const double ssmErr = relativeError(kept[next].ssm, ref.ssm);
                worstState = std::max({worstState, convErr, ssmErr});
                QVERIFY2(convErr < 1e-5 && ssmErr < 1e-5,
                         qPrintable(QString("state after %1: conv %2, ssm %3").arg(t + 1).arg(convErr).arg(ssmErr)));
                ++next;
            }
        }
        qInfo("worst relative error: outputs %.2g, states %.2g", worstOut, worstState);
        // The state the forward leaves is the last one.
        QCOMPARE(state.ssm, kept.back().ssm);
        QCOMPARE(state.conv, kept.back().conv);
    }

    // Stepping in pieces (a prefill, then tokens one by one) gives the same bits as one pass:
    // what makes a state at a checkpoint exact, in every numerics.
    void piecesGiveTheSameBits()
    {
        const Mamba2Mixer mixer(kHidden, smallShape(), 11);
        const Matrix h = inputs(20, kHidden, 5);
        for (Numerics n : {Numerics::Baseline, Numerics::Expected, Numerics::Engine}) {
            Mamba2State whole = mixer.initialState(), pieces = mixer.initialState();
            const Matrix all = mixer.forward(h, whole, n);
            Matrix first(13, kHidden);
            std::copy_n(h.values.begin(), first.values.size(), first.values.begin());
            const Matrix a = mixer.forward(first, pieces, n);
            QCOMPARE(std::vector<float>(all.values.begin(), all.values.begin() + 13 * kHidden), a.values);
            for (int t = 13; t < 20; ++t) {
                Matrix one(1, kHidden);
                std::copy_n(h.row(t), kHidden, one.row(0));
                QCOMPARE(mixer.forward(one, pieces, n).values, std::vector<float>(all.row(t), all.row(t) + kHidden));
            }
            QCOMPARE(pieces.ssm, whole.ssm);
            QCOMPARE(pieces.conv, whole.conv);
        }
    }

    // The bf16 numerics compute the same function with bf16 roundings: near the double
    // reference run on the bf16-rounded weights (a bf16 rounding is 2^-9 = 2e-3 relative; a
    // few dozen of them, partly cancelling: within 3e-2), different from each other (another
    // rounding order), and their states stored as their dtypes say: HF's SSM state in bf16, the
    // engine's in fp32 (bf16 when engineStateBf16), the conv state the bf16 inputs.
    void bf16NumericsNearTheRecurrence()
    {
        Mamba2Shape shape = smallShape();
        const Mamba2Mixer mixer(kHidden, shape, 11);
        const Matrix h = [&] {
            Matrix m = inputs(kTokens, kHidden, 9);
            roundInPlace(m.values);
            return m;
        }();
        ReferenceMamba2 ref(shape, mixer.weights(Numerics::Expected), kHidden);
        for (int t = 0; t < kTokens; ++t)
            ref.step(Vec(h.row(t), h.row(t) + kHidden));
        const auto isBf16 = [](const std::vector<float>& v) {
            std::vector<float> r = v;
            roundInPlace(r);
            return r == v;
        };
        std::vector<float> expectedSsm;
        for (Numerics n : {Numerics::Expected, Numerics::Engine}) {
            Mamba2State state = mixer.initialState();
            mixer.forward(h, state, n);
            const double err = relativeError(state.ssm, ref.ssm);
            QVERIFY2(err < 3e-2, qPrintable(QString("numerics %1: ssm relative error %2").arg(int(n)).arg(err)));
            QVERIFY(relativeError(state.conv, ref.conv) < 1e-2);
            QVERIFY(isBf16(state.conv));
            QCOMPARE(isBf16(state.ssm), n == Numerics::Expected);
            if (n == Numerics::Expected)
                expectedSsm = state.ssm;
            else
                QVERIFY(state.ssm != expectedSsm);
        }
        shape.engineStateBf16 = true;
        const Mamba2Mixer bf16State(kHidden, shape, 11);
        Mamba2State state = bf16State.initialState();
        bf16State.forward(h, state, Numerics::Engine);
        QVERIFY(isBf16(state.ssm));
        QVERIFY(relativeError(state.ssm, ref.ssm) < 3e-2);
    }

    // One head, head_dim 1, d_state 1, one group, d_conv 3; hidden 1. in_proj takes u to
    // z = u, x = u, B = 2u, C = u/2, dt = 0 (dt_bias 0: dt = softplus(0) = ln 2); A_log 0 (A = -1,
    // so exp(dt A) = 1/2); the convolution weighs (oldest, middle, current) as (0.5, 0, 1), no
    // bias; D 1, norm 1, out_proj 1. Tokens u = 1, -2, 3; in_c(t) = coef_c u_t:
    //   t0: x = silu(1) = 0.7310586, B = silu(2) = 1.7615942, C = silu(0.5) = 0.3112297;
    //       h = ln2 x B = 0.8926547; y = C h + x = 1.0088792; g = y silu(1) = 0.7375549;
    //       out = g / sqrt(g^2 + 1e-5) = 0.9999908
    //   t1: x = silu(-2) = -0.2384058, B = silu(-4) = -0.0719448, C = silu(-1) = -0.2689414;
    //       h = h/2 + ln2 x B = 0.4582163; y = -0.3616392; g = y silu(-2) = 0.0862169;
    //       out = 0.9993280
    //   t2: x = silu(0.5 * 1 + 3) = 3.3974072, B = silu(0.5 * 2 + 6) = 6.9936226,
    //       C = silu(0.5 * 0.5 + 1.5) = 1.4909174; h = 16.6984126; out = 1.0000000
    // and the conv state after t2 is each channel's inputs at t1 and t2: x (-2, 3), B (-4, 6),
    // C (-1, 1.5).
    void handWorkedOneHead()
    {
        Mamba2Shape s;
        s.heads = 1;
        s.headDim = 1;
        s.stateSize = 1;
        s.groups = 1;
        s.convWidth = 3;
        Mamba2Mixer::Weights w;
        w.inProj = Matrix(1, 5);
        w.inProj.values = {1.0f, 1.0f, 2.0f, 0.5f, 0.0f};  // z, x, B, C, dt
        w.conv = Matrix(3, 3);
        w.conv.values = {0.5f, 0, 1, 0.5f, 0, 1, 0.5f, 0, 1};
        w.convBias = {0, 0, 0};
        w.dtBias = {0};
        w.aLog = {0};
        w.d = {1};
        w.norm = {1};
        w.outProj = Matrix(1, 1);
        w.outProj.values = {1.0f};
        const Mamba2Mixer mixer(s, w);
        Matrix u(3, 1);
        u.values = {1.0f, -2.0f, 3.0f};
        Mamba2State state = mixer.initialState();
        std::vector<float> h;
        const Matrix out = mixer.forward(u, state, Numerics::Baseline, [&](int, Mamba2State& st) { h.push_back(st.ssm[0]); });
        const std::vector<double> wantH{0.8926547, 0.4582163, 16.6984126}, wantOut{0.9999908, 0.9993280, 1.0};
        for (int t = 0; t < 3; ++t) {
            QVERIFY2(std::fabs(h[std::size_t(t)] - wantH[std::size_t(t)]) < 1e-6 * std::max(1.0, wantH[std::size_t(t)]),
                     qPrintable(QString("h after %1: %2").arg(t + 1).arg(h[std::size_t(t)])));
            QVERIFY2(std::fabs(out.values[std::size_t(t)] - wantOut[std::size_t(t)]) < 1e-6,
                     qPrintable(QString("out %1: %2").arg(t).arg(out.values[std::size_t(t)])));
        }
        QCOMPARE(state.conv, (std::vector<float>{-2, 3, -4, 6, -1, 1.5f}));
    }

    // A state of the wrong size is refused, not read past its end.
    void wrongStateRefused()
    {
        const Mamba2Mixer mixer(kHidden, smallShape(), 11);
        Mamba2State state = mixer.initialState();
        state.ssm.pop_back();
        QVERIFY_THROWS_EXCEPTION(std::invalid_argument, mixer.forward(inputs(1, kHidden, 1), state, Numerics::Engine));
    }
};

QTEST_APPLESS_MAIN(TestMamba2Mixer)
#include "tst_mamba2_mixer.moc"
