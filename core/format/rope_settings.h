#pragma once
// The model's rotary position embedding, as the bundle's `rope` metadata attribute records it
// (docs/bundle-format.md): what the suspects need to test a RoPE hypothesis (undo the
// reference's rotation, redo it another way). Optional: without it no RoPE hypothesis is tried.

#include "format/capture_bundle.h"

#include <optional>
#include <string>
#include <vector>

namespace kvscope {

struct RopeSettings {
    double theta = 10000.0;
    int rotaryDim = 0;             // the first rotaryDim values of each head rotate (0: head_dim)
    bool neoxStyle = true;         // rotate halves (vLLM is_neox_style, HF rotate_half); false: interleaved pairs (GPT-J)
    double positionScale = 1.0;    // linear scaling: positions divided by this factor
};

// The bundle's `rope` attribute: {"theta": 10000, "rotary_dim": 128, "style": "neox" | "gptj",
// "scaling": {"type": "linear", "factor": 2}} (style, rotary_dim and scaling optional). None when
// absent; BundleError naming the file and what is wrong when malformed or of a scaling type the
// tests cannot reproduce.
std::optional<RopeSettings> ropeSettingsOf(const BundleMetadata& metadata, const std::string& file);

// Rotates one head vector (dim values) as position `position` under `rope`, in double;
// `inverse` undoes it.
void applyRope(const RopeSettings& rope, int dim, double position, bool inverse, const double* in, double* out);

// The same for many vectors: the frequencies computed once, and the angles of one position
// once for every vector rotated by it.
class RopeRotation {
public:
    RopeRotation(const RopeSettings& rope, int dim);
    // Sets the position (inverse: its inverse rotation).
    void setPosition(double position, bool inverse = false);
    void apply(const double* in, double* out) const;

private:
    RopeSettings m_rope;
    int m_dim, m_rotary;
    std::vector<double> m_invFreq, m_cos, m_sin;
};

}  // namespace kvscope
