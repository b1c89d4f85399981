#include "metrics/vector_metrics.h"

#include "util/simd_clones.h"

#include <algorithm>
#include <cmath>

namespace kvscope {

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
    // Any NaN or infinity (a float squared cannot overflow a double) shows in the sums.
    if (!std::isfinite(refSq + xSq))
        return false;
    out.cos = dot / (std::max(std::sqrt(refSq), kCosineEps) * std::max(std::sqrt(xSq), kCosineEps));
    out.linf = maxDiff / std::max(maxRef, kRelativeEps);
    out.l2 = std::sqrt(diffSq) / std::max(std::sqrt(refSq), kRelativeEps);
    return true;
}

}  // namespace kvscope
