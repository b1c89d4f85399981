#pragma once
// Hot loops are compiled twice, for the x86-64 baseline and for AVX2, and the loader picks
// the right one for the CPU (GCC function multi-versioning); elsewhere this is empty. Not
// under ThreadSanitizer: its runtime is not up yet when the loader runs the resolvers.

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(__SANITIZE_THREAD__)
#define KVSCOPE_VECTOR_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define KVSCOPE_VECTOR_CLONES
#endif

#include <cstdlib>
#include <string_view>

namespace kvscope {

// Whether the hand-written AVX2 paths may run: the CPU has AVX2, and KVSCOPE_SIMD=sse2 does
// not force the baseline (the tests run both).
inline bool useAvx2()
{
    const char* forced = std::getenv("KVSCOPE_SIMD");
    if (forced && std::string_view(forced) == "sse2")
        return false;
#if defined(__x86_64__) && defined(__GNUC__)
    return __builtin_cpu_supports("avx2");
#else
    return false;
#endif
}

}  // namespace kvscope
