#pragma once
// Hot loops are compiled twice, for the x86-64 baseline and for AVX2, and the loader picks
// the right one for the CPU (GCC function multi-versioning); elsewhere this is empty. Not
// under ThreadSanitizer: its runtime is not up yet when the loader runs the resolvers.

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(__SANITIZE_THREAD__)
#define KVSCOPE_VECTOR_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define KVSCOPE_VECTOR_CLONES
#endif
