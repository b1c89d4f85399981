#include "metrics/vector_metrics.h"

#include "util/simd_clones.h"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace kvscope {

namespace {

bool finish(double dot, double refSq, double xSq, double diffSq, double maxDiff, double maxRef, VectorComparison& out)
{
    // Any NaN or infinity (a float squared cannot overflow a double) shows in the sums.
    if (!std::isfinite(refSq + xSq))
        return false;
    out.cos = dot / (std::max(std::sqrt(refSq), kCosineEps) * std::max(std::sqrt(xSq), kCosineEps));
    out.linf = maxDiff / std::max(maxRef, kRelativeEps);
    out.l2 = std::sqrt(diffSq) / std::max(std::sqrt(refSq), kRelativeEps);
    return true;
}

// The baseline: GCC's `omp simd` reductions, reassociated as its vectoriser likes.
bool compareVectorsGeneric(const float* ref, const float* x, int dim, VectorComparison& out)
{
    double dot = 0, refSq = 0, xSq = 0, diffSq = 0, maxDiff = 0, maxRef = 0;
#pragma omp simd reduction(+ : dot, refSq, xSq, diffSq) reduction(max : maxDiff, maxRef)
    for (int d = 0; d < dim; ++d) {
        const double r = ref[d], v = x[d];
        const double diff = r - v;
        dot += r * v;
        refSq += r * r;
        xSq += v * v;
        diffSq += diff * diff;
        maxDiff = maxDiff > std::fabs(diff) ? maxDiff : std::fabs(diff);
        maxRef = maxRef > std::fabs(r) ? maxRef : std::fabs(r);
    }
    return finish(dot, refSq, xSq, diffSq, maxDiff, maxRef, out);
}

int compareVectorPairGeneric(const float* ref, const float* x, const float* y, int dim, VectorComparison& outX,
                             VectorComparison& outY)
{
    double refSq = 0, maxRef = 0;
    double dotX = 0, xSq = 0, diffSqX = 0, maxDiffX = 0;
    double dotY = 0, ySq = 0, diffSqY = 0, maxDiffY = 0;
#pragma omp simd reduction(+ : refSq, dotX, xSq, diffSqX, dotY, ySq, diffSqY) \
    reduction(max : maxRef, maxDiffX, maxDiffY)
    for (int d = 0; d < dim; ++d) {
        const double r = ref[d], u = x[d], v = y[d];
        const double du = r - u, dv = r - v;
        refSq += r * r;
        maxRef = maxRef > std::fabs(r) ? maxRef : std::fabs(r);
        dotX += r * u;
        xSq += u * u;
        diffSqX += du * du;
        maxDiffX = maxDiffX > std::fabs(du) ? maxDiffX : std::fabs(du);
        dotY += r * v;
        ySq += v * v;
        diffSqY += dv * dv;
        maxDiffY = maxDiffY > std::fabs(dv) ? maxDiffY : std::fabs(dv);
    }
    return (finish(dotX, refSq, xSq, diffSqX, maxDiffX, maxRef, outX) ? 1 : 0) |
           (finish(dotY, refSq, ySq, diffSqY, maxDiffY, maxRef, outY) ? 2 : 0);
}

#if defined(__x86_64__) && defined(__GNUC__)
// AVX2 and AVX-512, written out: the sums in eight lanes, lane j adding up the elements
// d = j mod 8 in order, the elements after the last multiple of 8 added to lane 0, then
// lanes 0..7 summed: how the 8-wide reduction GCC made of the loops above for AVX2 adds,
// so every path but the baseline gives the same bits. AVX2 takes lanes 0-3 and then 4-7
// (all eight at once need more registers than it has: the compiler's version spilled),
// AVX-512 all eight. No fused multiply-adds (this file is built without contraction).
// The helpers below are always inlined into the AVX functions: no call passes their vectors.
#pragma GCC diagnostic ignored "-Wpsabi"

// The sums of a comparison: ref², ref·x, x², (ref - x)², and of a pair the same for y.
enum Sum { RefSq, DotX, XSq, DiffSqX, DotY, YSq, DiffSqY, SumCount };

// The vector types of a width (spelled out: GCC's vector builtins reject them as template-
// dependent types).
template <int Width>
struct Lanes;
template <>
struct Lanes<4> {
    typedef float Floats __attribute__((vector_size(16)));
    typedef double Doubles __attribute__((vector_size(32)));
    typedef long long Bits __attribute__((vector_size(32)));
};
template <>
struct Lanes<8> {
    typedef float Floats __attribute__((vector_size(32)));
    typedef double Doubles __attribute__((vector_size(64)));
    typedef long long Bits __attribute__((vector_size(64)));
};

template <int Width>
[[gnu::always_inline]] inline typename Lanes<Width>::Doubles load(const float* p)
{
    typename Lanes<Width>::Floats f;
    std::memcpy(&f, p, sizeof f);
    typename Lanes<Width>::Doubles d;
    for (int j = 0; j < Width; ++j)  // one conversion instruction
        d[j] = f[j];
    return d;
}

template <int Width>
[[gnu::always_inline]] inline typename Lanes<Width>::Doubles abs(typename Lanes<Width>::Doubles v)
{
    using Bits = typename Lanes<Width>::Bits;
    return typename Lanes<Width>::Doubles(Bits(v) & (Bits{} + 0x7fffffffffffffffLL));
}

template <typename V>
[[gnu::always_inline]] inline V max(V a, V b)
{
    return a > b ? a : b;
}

// The vector part of a comparison (Count 1) or a pair (2) for lanes [first, first + Width):
// their sums into lanes[sum][first..], their maxima (ref, x, y) into maxima.
template <int Width, int Count>
[[gnu::always_inline]] inline void addLanes(const float* ref, const float* x, const float* y, int full, int first,
                                            double (*lanes)[8], double* maxima)
{
    typename Lanes<Width>::Doubles s[SumCount] = {}, maxRef = {}, maxX = {}, maxY = {};
    for (int d = first; d < full; d += 8) {
        const auto r = load<Width>(ref + d), u = load<Width>(x + d);
        const auto du = r - u;
        s[RefSq] += r * r;
        s[DotX] += r * u;
        s[XSq] += u * u;
        s[DiffSqX] += du * du;
        maxRef = max(maxRef, abs<Width>(r));
        maxX = max(maxX, abs<Width>(du));
        if constexpr (Count == 2) {
            const auto v = load<Width>(y + d);
            const auto dv = r - v;
            s[DotY] += r * v;
            s[YSq] += v * v;
            s[DiffSqY] += dv * dv;
            maxY = max(maxY, abs<Width>(dv));
        }
    }
    for (int k = 0; k < SumCount; ++k)
        std::memcpy(&lanes[k][first], &s[k], sizeof s[k]);
    double m[3][Width];
    std::memcpy(m[0], &maxRef, sizeof maxRef);
    std::memcpy(m[1], &maxX, sizeof maxX);
    std::memcpy(m[2], &maxY, sizeof maxY);
    for (int j = 0; j < Width; ++j)  // maxima are exact in any order
        for (int k = 0; k < 3; ++k)
            maxima[k] = std::max(maxima[k], m[k][j]);
}

template <int Width, int Count>
[[gnu::always_inline]] inline int compareLanes(const float* ref, const float* x, const float* y, int dim,
                                               VectorComparison& outX, VectorComparison& outY)
{
    double lanes[SumCount][8];
    double maxima[3] = {0, 0, 0};
    const int full = dim > 0 ? dim & ~7 : 0;
    for (int first = 0; first < 8; first += Width)
        addLanes<Width, Count>(ref, x, y, full, first, lanes, maxima);
    for (int d = full; d < dim; ++d) {
        const double r = ref[d], u = x[d], du = r - u;
        lanes[RefSq][0] += r * r;
        lanes[DotX][0] += r * u;
        lanes[XSq][0] += u * u;
        lanes[DiffSqX][0] += du * du;
        maxima[0] = maxima[0] > std::fabs(r) ? maxima[0] : std::fabs(r);
        maxima[1] = maxima[1] > std::fabs(du) ? maxima[1] : std::fabs(du);
        if constexpr (Count == 2) {
            const double v = y[d], dv = r - v;
            lanes[DotY][0] += r * v;
            lanes[YSq][0] += v * v;
            lanes[DiffSqY][0] += dv * dv;
            maxima[2] = maxima[2] > std::fabs(dv) ? maxima[2] : std::fabs(dv);
        }
    }
    double sums[SumCount];
    for (int k = 0; k < (Count == 2 ? SumCount : DotY); ++k) {
        sums[k] = 0;
        for (int j = 0; j < 8; ++j)
            sums[k] += lanes[k][j];
    }
    int ok = finish(sums[DotX], sums[RefSq], sums[XSq], sums[DiffSqX], maxima[1], maxima[0], outX) ? 1 : 0;
    if constexpr (Count == 2)
        ok |= finish(sums[DotY], sums[RefSq], sums[YSq], sums[DiffSqY], maxima[2], maxima[0], outY) ? 2 : 0;
    return ok;
}

[[gnu::target("avx2")]] int compareAvx2(const float* ref, const float* x, const float* y, int dim,
                                        VectorComparison& outX, VectorComparison& outY)
{
    return y ? compareLanes<4, 2>(ref, x, y, dim, outX, outY) : compareLanes<4, 1>(ref, x, y, dim, outX, outY);
}

[[gnu::target("avx512f")]] int compareAvx512(const float* ref, const float* x, const float* y, int dim,
                                             VectorComparison& outX, VectorComparison& outY)
{
    return y ? compareLanes<8, 2>(ref, x, y, dim, outX, outY) : compareLanes<8, 1>(ref, x, y, dim, outX, outY);
}
#endif

// One comparison (y null) or a pair.
using CompareFn = int (*)(const float*, const float*, const float*, int, VectorComparison&, VectorComparison&);

int compareGeneric(const float* ref, const float* x, const float* y, int dim, VectorComparison& outX,
                   VectorComparison& outY)
{
    return y ? compareVectorPairGeneric(ref, x, y, dim, outX, outY) : (compareVectorsGeneric(ref, x, dim, outX) ? 1 : 0);
}

CompareFn chooseCompare()
{
#if defined(__x86_64__) && defined(__GNUC__)
    return pickBySimdLevel<CompareFn>(compareAvx512, compareAvx2, compareGeneric);
#else
    return compareGeneric;
#endif
}

}  // namespace

bool compareVectors(const float* ref, const float* x, int dim, VectorComparison& out)
{
    static const CompareFn compare = chooseCompare();
    VectorComparison unused;
    return compare(ref, x, nullptr, dim, out, unused) == 1;
}

int compareVectorPair(const float* ref, const float* x, const float* y, int dim, VectorComparison& outX,
                      VectorComparison& outY)
{
    static const CompareFn compare = chooseCompare();
    return compare(ref, x, y, dim, outX, outY);
}

}  // namespace kvscope
