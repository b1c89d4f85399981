#pragma once
// The unnormalised Walsh-Hadamard transform, as vLLM's fast_hadamard_transform computes it for
// int4_per_token_head: y = H_d x with H_1 = [1], H_2n = [[H_n, H_n], [H_n, -H_n]] (Sylvester's
// order: H[i][j] = (-1)^popcount(i & j)). H_d H_d = d I, so the transform divided by d undoes it.

namespace kvscope {

bool isPowerOfTwo(int d);
// In place, in O(d log d); d must be a power of two (else nothing is done).
void walshHadamard(double* x, int d);
void walshHadamard(float* x, int d);

}  // namespace kvscope
