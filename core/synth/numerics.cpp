#include "synth/numerics.h"

#include "util/deterministic_math.h"
#include "util/simd_clones.h"

#include <algorithm>

namespace kvscope::synth {

namespace {

using detmath::roundToBf16;

// The engine's GEMMs sum each output's products in chunks of this many (split-K), then add
// the chunk sums in order; the reference sums them in one pass.
constexpr int kEngineSplitK = 64;

// y[n, N] = x[n, K] w[K, N]. Each output sums its K products in fp32 in chunks of `chunk`
// (in order within a chunk, then the chunk sums in order). Vectorised across outputs only, so
// every output's additions happen in the same order whatever the instruction set.
[[gnu::always_inline]] inline void matmulBody(const float* x, int n, int K, const float* w, int N, float* y, int chunk)
{
    constexpr int kCols = 256, kRows = 4;
    float acc[kRows][kCols];
    float part[kRows][kCols];
    for (int j0 = 0; j0 < N; j0 += kCols) {
        const int nb = std::min(kCols, N - j0);
        for (int i0 = 0; i0 < n; i0 += kRows) {
            const int nt = std::min(kRows, n - i0);
            for (int t = 0; t < nt; ++t)
                std::fill_n(acc[t], nb, 0.0f);
            for (int k0 = 0; k0 < K; k0 += chunk) {
                const int k1 = std::min(K, k0 + chunk);
                for (int t = 0; t < nt; ++t)
                    std::fill_n(part[t], nb, 0.0f);
                for (int k = k0; k < k1; ++k) {
                    const float* wRow = w + std::size_t(k) * std::size_t(N) + std::size_t(j0);
                    for (int t = 0; t < nt; ++t) {
                        const float xv = x[std::size_t(i0 + t) * std::size_t(K) + std::size_t(k)];
                        float* p = part[t];
                        for (int j = 0; j < nb; ++j)
                            p[j] += xv * wRow[j];
                    }
                }
                for (int t = 0; t < nt; ++t)
                    for (int j = 0; j < nb; ++j)
                        acc[t][j] += part[t][j];
            }
            for (int t = 0; t < nt; ++t)
                std::copy_n(acc[t], nb, y + std::size_t(i0 + t) * std::size_t(N) + std::size_t(j0));
        }
    }
}

// The same loops compiled for the x86-64 baseline and for AVX2 (without FMA): the same bits.
void matmulBaseline(const float* x, int n, int K, const float* w, int N, float* y, int chunk)
{
    matmulBody(x, n, K, w, N, y, chunk);
}

#if defined(__x86_64__) && defined(__GNUC__)
[[gnu::target("avx2")]] void matmulAvx2(const float* x, int n, int K, const float* w, int N, float* y, int chunk)
{
    matmulBody(x, n, K, w, N, y, chunk);
}
#endif

using MatmulFn = void (*)(const float*, int, int, const float*, int, float*, int);

MatmulFn chooseMatmul()
{
#if defined(__x86_64__) && defined(__GNUC__)
    if (useAvx2())
        return matmulAvx2;
#endif
    return matmulBaseline;
}

}  // namespace

void roundInPlace(std::vector<float>& values)
{
    for (float& x : values)
        x = roundToBf16(x);
}

Matrix randomMatrix(detmath::NormalSampler& normal, int rows, int cols, double stddev)
{
    Matrix m(rows, cols);
    for (float& x : m.values)
        x = float(normal() * stddev);
    return m;
}

Matrix linear(const Matrix& x, const Matrix& w, Numerics n)
{
    static const MatmulFn matmul = chooseMatmul();
    Matrix y(x.rows, w.cols);
    matmul(x.values.data(), x.rows, x.cols, w.values.data(), w.cols, y.values.data(),
           n == Numerics::Engine ? kEngineSplitK : x.cols);
    if (n != Numerics::Baseline)
        roundInPlace(y.values);  // bf16 output
    return y;
}

float silu(float x)
{
    return float(double(x) / (1.0 + detmath::exp(-double(x))));
}

}  // namespace kvscope::synth
