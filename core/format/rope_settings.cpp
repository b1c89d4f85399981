#include "format/rope_settings.h"

#include "format/bundle_error.h"

#include <nlohmann/json.hpp>

#include <cmath>
#include <vector>

namespace kvscope {

std::optional<RopeSettings> ropeSettingsOf(const BundleMetadata& metadata, const std::string& file)
{
    const auto it = metadata.extra.find("rope");
    if (it == metadata.extra.end())
        return std::nullopt;
    const auto fail = [&](const std::string& what) -> std::optional<RopeSettings> {
        throw BundleError(file, "metadata attribute 'rope'", what);
    };
    nlohmann::json j;
    try {
        j = nlohmann::json::parse(it->second);
    } catch (const nlohmann::json::exception& e) {
        return fail(std::string("not JSON (") + e.what() + ")");
    }
    if (!j.is_object() || !j.contains("theta") || !j["theta"].is_number() || j["theta"].get<double>() <= 1.0)
        return fail("needs a number 'theta' above 1");
    RopeSettings r;
    r.theta = j["theta"].get<double>();
    if (j.contains("rotary_dim") && !j["rotary_dim"].is_null()) {
        if (!j["rotary_dim"].is_number_integer() || j["rotary_dim"].get<int>() < 2 || j["rotary_dim"].get<int>() % 2)
            return fail("'rotary_dim' must be an even integer of at least 2");
        r.rotaryDim = j["rotary_dim"].get<int>();
    }
    if (j.contains("style") && !j["style"].is_null()) {
        const std::string style = j["style"].is_string() ? j["style"].get<std::string>() : "";
        if (style != "neox" && style != "gptj")
            return fail("'style' must be \"neox\" (rotated halves) or \"gptj\" (interleaved pairs)");
        r.neoxStyle = style == "neox";
    }
    if (j.contains("scaling") && !j["scaling"].is_null()) {
        const nlohmann::json& s = j["scaling"];
        const std::string type = s.is_object() && s.contains("type") && s["type"].is_string() ? s["type"].get<std::string>() : "";
        if (type != "linear" && type != "default")
            return fail("scaling type '" + type + "' is not one the RoPE tests reproduce (linear or default)");
        if (type == "linear") {
            if (!s.contains("factor") || !s["factor"].is_number() || s["factor"].get<double>() <= 0)
                return fail("linear scaling needs a positive 'factor'");
            r.positionScale = s["factor"].get<double>();
        }
    }
    return r;
}

RopeRotation::RopeRotation(const RopeSettings& rope, int dim)
    : m_rope(rope)
    , m_dim(dim)
    , m_rotary(rope.rotaryDim > 0 && rope.rotaryDim <= dim ? rope.rotaryDim : dim)
{
    for (int i = 0; i < m_rotary / 2; ++i)
        m_invFreq.push_back(std::pow(rope.theta, -2.0 * i / m_rotary));
    m_cos.resize(m_invFreq.size());
    m_sin.resize(m_invFreq.size());
}

void RopeRotation::setPosition(double position, bool inverse)
{
    const double pos = position / m_rope.positionScale * (inverse ? -1.0 : 1.0);
    for (std::size_t i = 0; i < m_invFreq.size(); ++i) {
        m_cos[i] = std::cos(pos * m_invFreq[i]);
        m_sin[i] = std::sin(pos * m_invFreq[i]);
    }
}

void RopeRotation::apply(const double* in, double* out) const
{
    const int half = m_rotary / 2;
    for (int i = m_rotary; i < m_dim; ++i)
        out[i] = in[i];
    for (int i = 0; i < half; ++i) {
        const int lo = m_rope.neoxStyle ? i : 2 * i, hi = m_rope.neoxStyle ? i + half : 2 * i + 1;
        const double a = in[lo], b = in[hi], c = m_cos[std::size_t(i)], s = m_sin[std::size_t(i)];
        out[lo] = a * c - b * s;
        out[hi] = b * c + a * s;
    }
}

void applyRope(const RopeSettings& rope, int dim, double position, bool inverse, const double* in, double* out)
{
    RopeRotation r(rope, dim);
    r.setPosition(position, inverse);
    r.apply(in, out);
}

}  // namespace kvscope
