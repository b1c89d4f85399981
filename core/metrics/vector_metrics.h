#pragma once
// The per-(token, layer, head) comparisons of two head_dim vectors, with the reference
// tool's definitions and constants, accumulated in double.

namespace kvscope {

struct VectorComparison {
    double cos = 0;   // PyTorch cosine_similarity: dot / (max(|ref|, 1e-8) * max(|x|, 1e-8))
    double linf = 0;  // max|ref - x| / max(max|ref|, 1e-10)
    double l2 = 0;    // ||ref - x||_2 / max(||ref||_2, 1e-10)
};

inline constexpr double kCosineEps = 1e-8;
inline constexpr double kRelativeEps = 1e-10;

// False when any element of either vector is NaN or infinite (the result is then meaningless).
bool compareVectors(const float* ref, const float* x, int dim, VectorComparison& out);

// Both comparisons of a three-way analysis in one pass over `ref` (the same results as two
// compareVectors calls). Returns a bit per side that is finite: 1 for x, 2 for y.
int compareVectorPair(const float* ref, const float* x, const float* y, int dim, VectorComparison& outX,
                      VectorComparison& outY);

}  // namespace kvscope
