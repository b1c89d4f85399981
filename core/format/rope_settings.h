#pragma once
// The model's rotary position embedding, as the bundle's `rope` metadata attribute records it
// (docs/bundle-format.md): what the suspects need to test a RoPE hypothesis (undo the
// reference's rotation, redo it another way). Optional: without it no RoPE hypothesis is tried.

#include "format/capture_bundle.h"
#include "format/rope_frequencies.h"

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace kvscope {

struct RopeSettings {
    double theta = 10000.0;
    int rotaryDim = 0;             // the first rotaryDim values of each head rotate (0: head_dim)
    bool neoxStyle = true;         // rotate halves (vLLM is_neox_style, HF rotate_half); false: interleaved pairs (GPT-J)
    double positionScale = 1.0;    // linear scaling: positions divided by this factor
    RopeScaling scaling;           // llama3, yarn, longrope, dynamic (rope_frequencies.h); mrope's sections
};

// The bundle's `rope` attribute: {"theta": 10000, "rotary_dim": 128, "style": "neox" | "gptj",
// "scaling": {"type": "linear" | "llama3" | "yarn" | "longrope" | "dynamic" | "mrope" | "default",
// ...transformers' parameters}} (style, rotary_dim and scaling optional). None when absent;
// BundleError naming the file, the attribute and what is wrong when malformed, of an unknown
// type or with a parameter the type does not take.
std::optional<RopeSettings> ropeSettingsOf(const BundleMetadata& metadata, const std::string& file);

// Rotates one head vector (dim values) as position `position` under `rope`, in double;
// `inverse` undoes it.
void applyRope(const RopeSettings& rope, int dim, double position, bool inverse, const double* in, double* out);

// The same for many vectors: the frequencies computed once, and the angles of one position
// once for every vector rotated by it. `sequenceLength`: the length of the forward pass the
// vectors were rotated in (HF's max(position_ids) + 1), which dynamic NTK and longrope read;
// 0 for one within the original context.
class RopeRotation {
public:
    RopeRotation(const RopeSettings& rope, int dim, std::int64_t sequenceLength = 0);
    // Sets the position (inverse: its inverse rotation). Includes YaRN's and LongRoPE's
    // attention factor, which HF and vLLM multiply cos and sin by (inverse: divide).
    void setPosition(double position, bool inverse = false);
    // Sets a pure turn by `positions` positions' angles, without the attention factor: what
    // carries a vector rotated for t to t + positions.
    void setTurn(double positions);
    void apply(const double* in, double* out) const;

private:
    void setAngles(double position, double magnitude);

    RopeSettings m_rope;
    int m_dim, m_rotary;
    std::vector<double> m_invFreq, m_cos, m_sin;
};

}  // namespace kvscope
