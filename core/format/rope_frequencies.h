#pragma once
// A RoPE's inverse frequencies under the scalings the models people run use (llama3, yarn,
// longrope, dynamic NTK), computed in double as transformers defines them, and the factor YaRN
// and LongRoPE multiply cos and sin by (docs/bundle-format.md, the `rope` attribute).

#include <cstdint>
#include <string>
#include <vector>

namespace kvscope {

enum class RopeScalingType { Default, Llama3, Yarn, LongRope, Dynamic };

// The scaling's parameters, named after transformers' rope_scaling / rope_parameters keys. Linear
// scaling is RopeSettings::positionScale; mrope is the default rotation for text positions.
struct RopeScaling {
    RopeScalingType type = RopeScalingType::Default;
    double factor = 1.0;                  // llama3, yarn, longrope (for its default attention factor), dynamic
    double lowFreqFactor = 1.0;           // llama3
    double highFreqFactor = 4.0;          // llama3
    double originalMaxPositions = 0;      // llama3, yarn, longrope: original_max_position_embeddings
    double betaFast = 32, betaSlow = 1;   // yarn
    bool truncate = true;                 // yarn: correction range floored / ceiled
    double attentionFactor = 1.0;         // yarn, longrope: resolved; multiplies cos and sin (so K)
    std::vector<double> shortFactor, longFactor;  // longrope: one per rotated pair
    double maxPositions = 0;              // dynamic: max_position_embeddings
    std::vector<int> mropeSection;        // mrope: pairs per (temporal, height, width); text positions ignore it
};

// "default", "llama3", "yarn", "longrope", "dynamic".
std::string ropeScalingName(RopeScalingType type);

// inv_freq of rotary dims `rotary` (even) with base `theta` under `scaling`, for a forward pass
// over positions [0, sequenceLength) (dynamic NTK recomputes the base and longrope picks its
// factors from it; 0: a length within the original context). transformers'
// modeling_rope_utils.py, _compute_{default,llama3,yarn,longrope,dynamic_ntk}_parameters
// (huggingface/transformers main, rope_parameters era; read 2025, see docs/bundle-format.md).
std::vector<double> ropeInverseFrequencies(double theta, int rotary, const RopeScaling& scaling,
                                           std::int64_t sequenceLength);

// One inverse frequency under Llama 3.1's scaling (plain arithmetic: the same bits on every CPU,
// which the synthetic captures rely on).
double llama3InverseFrequency(double invFreq, const RopeScaling& scaling);

// YaRN's attention factor when the config gives none: get_mscale(factor, mscale) /
// get_mscale(factor, mscale_all_dim) when both are non-zero, else get_mscale(factor).
double yarnAttentionFactor(double factor, double mscale, double mscaleAllDim);

// LongRoPE's when the config gives none: sqrt(1 + ln(factor) / ln(original)), 1 for factor <= 1.
double longRopeAttentionFactor(double factor, double originalMaxPositions);

}  // namespace kvscope
