#pragma once
// Math whose results are the same bits on every x86-64 CPU, for synthetic data.
//
// glibc picks exp/log/sin/cos variants at load time (FMA or not), and libtorch/oneDNN pick
// their kernels by instruction set: both change the last bits of results from one CPU to
// another. Everything here is built from IEEE basic operations (+ - * / sqrt, correctly
// rounded on every CPU) in a fixed order, so a synthetic capture is the same file everywhere.
// The library is compiled with -ffp-contract=off so that no compiler fuses a multiply-add.

#include <cstdint>

namespace kvscope::detmath {

// e^x, within 2 ulp of double precision; 0 below -745, +inf above 709.8.
double exp(double x);
// sin and cos of x for |x| < 1e6 (Cody-Waite reduction by pi/2, Taylor series), within a
// few ulp of double precision.
void sinCos(double x, double& sin, double& cos);

// float -> nearest bf16 (ties to even), returned as a float.
float roundToBf16(float x);

// splitmix64: a fast, seedable stream of 64-bit values.
class SplitMix64 {
public:
    explicit SplitMix64(std::uint64_t seed) : m_state(seed) {}
    std::uint64_t next()
    {
        std::uint64_t z = (m_state += 0x9e3779b97f4a7c15ULL);
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
        return z ^ (z >> 31);
    }
    // Uniform in [0, 1) with 53 random bits.
    double uniform() { return double(next() >> 11) * 0x1.0p-53; }
    // Uniform integer in [0, n).
    std::uint64_t below(std::uint64_t n) { return std::uint64_t(uniform() * double(n)); }

private:
    std::uint64_t m_state;
};

// Standard normal samples (Box-Muller on the deterministic exp/log/sin/cos above).
class NormalSampler {
public:
    explicit NormalSampler(std::uint64_t seed) : m_bits(seed) {}
    double operator()();

private:
    SplitMix64 m_bits;
    double m_spare = 0;
    bool m_hasSpare = false;
};

// Natural logarithm of x > 0, within a few ulp of double precision.
double log(double x);

}  // namespace kvscope::detmath
