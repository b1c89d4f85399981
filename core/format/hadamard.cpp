#include "format/hadamard.h"

namespace kvscope {

bool isPowerOfTwo(int d)
{
    return d > 0 && (d & (d - 1)) == 0;
}

namespace {

template <typename T>
void butterflies(T* x, int d)
{
    if (!isPowerOfTwo(d))
        return;
    for (int half = 1; half < d; half *= 2)
        for (int i = 0; i < d; i += 2 * half)
            for (int j = i; j < i + half; ++j) {
                const T a = x[j], b = x[j + half];
                x[j] = a + b;
                x[j + half] = a - b;
            }
}

}  // namespace

void walshHadamard(double* x, int d)
{
    butterflies(x, d);
}

void walshHadamard(float* x, int d)
{
    butterflies(x, d);
}

}  // namespace kvscope
