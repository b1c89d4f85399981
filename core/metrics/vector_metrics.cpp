#include "metrics/vector_metrics.h"

#include "util/simd_clones.h"

#include <algorithm>
#include <cmath>

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

}  // namespace

KVSCOPE_VECTOR_CLONES
bool compareVectors(const float* ref, const float* x, int dim, VectorComparison& out)
{
    double dot = 0, refSq = 0, xSq = 0, diffSq = 0, maxDiff = 0, maxRef = 0;
    // Vectorised (the sums are reassociated, still in double).
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

KVSCOPE_VECTOR_CLONES
int compareVectorPair(const float* ref, const float* x, const float* y, int dim, VectorComparison& outX,
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

}  // namespace kvscope
