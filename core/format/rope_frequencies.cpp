#include "format/rope_frequencies.h"

#include <algorithm>
#include <cmath>
#include <numbers>

namespace kvscope {

namespace {

}  // namespace

// Llama 3.1 (_compute_llama3_parameters; vLLM Llama3RotaryEmbedding is the same but for
// low_freq_factor == high_freq_factor, where it takes no middle band and HF divides by zero):
// wavelengths beyond original / low_freq_factor slowed by factor, those under original /
// high_freq_factor kept, the band between blended.
double llama3InverseFrequency(double invFreq, const RopeScaling& s)
{
    const double wavelen = 2 * std::numbers::pi / invFreq;
    const double lowWavelen = s.originalMaxPositions / s.lowFreqFactor, highWavelen = s.originalMaxPositions / s.highFreqFactor;
    if (wavelen < highWavelen)
        return invFreq;
    if (wavelen > lowWavelen || s.highFreqFactor == s.lowFreqFactor)
        return invFreq / s.factor;
    const double smooth = (s.originalMaxPositions / wavelen - s.lowFreqFactor) / (s.highFreqFactor - s.lowFreqFactor);
    return (1 - smooth) * invFreq / s.factor + smooth * invFreq;
}

namespace {

// YaRN (_compute_yarn_parameters): pair i extrapolated (kept) below the correction range,
// interpolated (divided by factor) above it, a linear ramp between. The range is where a pair
// turns beta_fast and beta_slow times over original_max_position_embeddings.
std::vector<double> yarn(double theta, int rotary, const RopeScaling& s)
{
    const auto correctionDim = [&](double rotations) {
        return rotary * std::log(s.originalMaxPositions / (rotations * 2 * std::numbers::pi)) / (2 * std::log(theta));
    };
    double low = correctionDim(s.betaFast), high = correctionDim(s.betaSlow);
    if (s.truncate)
        low = std::floor(low), high = std::ceil(high);
    low = std::max(low, 0.0);
    high = std::min(high, double(rotary - 1));
    if (low == high)
        high += 0.001;  // as transformers does, against a division by zero
    std::vector<double> out;
    for (int i = 0; i < rotary / 2; ++i) {
        const double extrapolation = std::pow(theta, -2.0 * i / rotary), interpolation = extrapolation / s.factor;
        const double ramp = std::clamp((i - low) / (high - low), 0.0, 1.0);
        const double keep = 1 - ramp;  // inv_freq_extrapolation_factor
        out.push_back(interpolation * (1 - keep) + extrapolation * keep);
    }
    return out;
}

}  // namespace

std::string ropeScalingName(RopeScalingType type)
{
    switch (type) {
    case RopeScalingType::Default:
        return "default";
    case RopeScalingType::Llama3:
        return "llama3";
    case RopeScalingType::Yarn:
        return "yarn";
    case RopeScalingType::LongRope:
        return "longrope";
    case RopeScalingType::Dynamic:
        return "dynamic";
    }
    return "default";
}

std::vector<double> ropeInverseFrequencies(double theta, int rotary, const RopeScaling& s, std::int64_t sequenceLength)
{
    const double length = double(sequenceLength);
    if (s.type == RopeScalingType::Yarn)
        return yarn(theta, rotary, s);
    double base = theta;
    // Dynamic NTK (_compute_dynamic_ntk_parameters, called with seq_len = max(position_ids) + 1
    // when the sequence outgrows max_position_embeddings): a larger base.
    if (s.type == RopeScalingType::Dynamic && length > s.maxPositions)
        base = theta * std::pow(s.factor * length / s.maxPositions - (s.factor - 1), double(rotary) / (rotary - 2));
    const bool longFactors = s.type == RopeScalingType::LongRope && length > s.originalMaxPositions;
    std::vector<double> out;
    for (int i = 0; i < rotary / 2; ++i) {
        double f = std::pow(base, -2.0 * i / rotary);  // as RoPE always computed it here: bundles without scaling unchanged
        if (s.type == RopeScalingType::Llama3)
            f = llama3InverseFrequency(f, s);
        else if (s.type == RopeScalingType::LongRope)  // 1 / (ext_factors * base^(2i/d))
            f /= (longFactors ? s.longFactor : s.shortFactor)[std::size_t(i)];
        out.push_back(f);
    }
    return out;
}

double yarnAttentionFactor(double factor, double mscale, double mscaleAllDim)
{
    const auto getMscale = [](double scale, double m) { return scale <= 1 ? 1.0 : 0.1 * m * std::log(scale) + 1.0; };
    if (mscale != 0 && mscaleAllDim != 0)
        return getMscale(factor, mscale) / getMscale(factor, mscaleAllDim);
    return getMscale(factor, 1.0);
}

double longRopeAttentionFactor(double factor, double originalMaxPositions)
{
    return factor <= 1.0 ? 1.0 : std::sqrt(1 + std::log(factor) / std::log(originalMaxPositions));
}

}  // namespace kvscope
