#pragma once
// Hot loops are compiled twice, for the x86-64 baseline and for AVX2, and the loader picks
// the right one for the CPU (GCC function multi-versioning); elsewhere this is empty. Not
// under ThreadSanitizer: its runtime is not up yet when the loader runs the resolvers.

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(__SANITIZE_THREAD__)
#define KVSCOPE_VECTOR_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define KVSCOPE_VECTOR_CLONES
#endif

#include <cstdlib>
#include <string_view>

namespace kvscope {

enum class SimdLevel { Baseline, Avx2, Avx512 };

// The widest hand-written paths the CPU may run: AVX-512 (F), AVX2 or the x86-64 baseline;
// KVSCOPE_SIMD=sse2 or KVSCOPE_SIMD=avx2 caps it (the tests run each path the CPU has).
inline SimdLevel simdLevel()
{
#if defined(__x86_64__) && defined(__GNUC__)
    const char* forced = std::getenv("KVSCOPE_SIMD");
    const std::string_view cap = forced ? forced : "";
    if (cap == "sse2" || !__builtin_cpu_supports("avx2"))
        return SimdLevel::Baseline;
    if (cap == "avx2" || !__builtin_cpu_supports("avx512f"))
        return SimdLevel::Avx2;
    return SimdLevel::Avx512;
#else
    return SimdLevel::Baseline;
#endif
}

// The path for the SIMD level: one of a hand-written kernel's versions.
template <typename Fn>
Fn pickBySimdLevel(Fn avx512, Fn avx2, Fn baseline)
{
    switch (simdLevel()) {
    case SimdLevel::Avx512:
        return avx512;
    case SimdLevel::Avx2:
        return avx2;
    case SimdLevel::Baseline:
        break;
    }
    return baseline;
}

// Whether the hand-written AVX2 paths may run.
inline bool useAvx2()
{
    return simdLevel() != SimdLevel::Baseline;
}

}  // namespace kvscope
