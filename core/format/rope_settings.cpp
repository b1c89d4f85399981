#include "format/rope_settings.h"

#include "format/bundle_error.h"

#include <nlohmann/json.hpp>

#include <cmath>
#include <functional>
#include <map>
#include <set>
#include <vector>

namespace kvscope {

namespace {

using Fail = std::function<void(const std::string&)>;

// The keys each scaling type takes, as transformers names them (modeling_rope_utils.py's
// _validate_*_rope_parameters), mrope_section everywhere (Qwen2-VL and its successors add it to
// their type), and the keys kvscope's writer adds (max_position_embeddings for dynamic).
const std::map<std::string, std::set<std::string>>& allowedKeys()
{
    static const std::map<std::string, std::set<std::string>> keys = {
        {"default", {}},
        {"mrope", {}},
        {"linear", {"factor"}},
        {"llama3", {"factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"}},
        {"yarn", {"factor", "original_max_position_embeddings", "beta_fast", "beta_slow", "attention_factor", "mscale",
                  "mscale_all_dim", "truncate"}},
        {"longrope", {"factor", "original_max_position_embeddings", "short_factor", "long_factor", "attention_factor"}},
        {"dynamic", {"factor", "max_position_embeddings"}},
    };
    return keys;
}

double positive(const nlohmann::json& s, const std::string& type, const std::string& key, const Fail& fail)
{
    if (!s.contains(key) || !s[key].is_number() || !(s[key].get<double>() > 0) || !std::isfinite(s[key].get<double>()))
        fail(type + " scaling needs a positive number '" + key + "'");
    return s[key].get<double>();
}

double optionalNumber(const nlohmann::json& s, const std::string& type, const std::string& key, double absent,
                      const Fail& fail)
{
    if (!s.contains(key) || s[key].is_null())
        return absent;
    if (!s[key].is_number() || !std::isfinite(s[key].get<double>()))
        fail(type + " scaling's '" + key + "' must be a number");
    return s[key].get<double>();
}

std::vector<double> factors(const nlohmann::json& s, const std::string& key, int rotaryDim, const Fail& fail)
{
    std::vector<double> out;
    if (s.contains(key) && s[key].is_array())
        for (const nlohmann::json& v : s[key])
            if (v.is_number() && v.get<double>() > 0 && std::isfinite(v.get<double>()))
                out.push_back(v.get<double>());
    if (!s.contains(key) || !s[key].is_array() || out.size() != s[key].size() || out.empty())
        fail("longrope scaling needs '" + key + "', a list of positive numbers");
    if (rotaryDim == 0)
        fail("longrope scaling needs 'rotary_dim' (its factors are one per rotated pair)");
    if (int(out.size()) != rotaryDim / 2)
        fail("longrope scaling's '" + key + "' has " + std::to_string(out.size()) + " factors for " +
             std::to_string(rotaryDim / 2) + " rotated pairs");
    return out;
}

// The `scaling` object into r (linear: r.positionScale; the others: r.scaling).
void readScaling(const nlohmann::json& s, RopeSettings& r, const Fail& fail)
{
    const std::string type = s.is_object() && s.contains("type") && s["type"].is_string() ? s["type"].get<std::string>() : "";
    const auto keys = allowedKeys().find(type);
    if (keys == allowedKeys().end())
        fail("scaling type '" + type + "' is not one kvscope reproduces (linear, llama3, yarn, longrope, dynamic, mrope, default)");
    for (const auto& [key, value] : s.items())
        if (key != "type" && key != "mrope_section" && !keys->second.count(key))
            fail(type + " scaling does not take '" + key + "'");
    RopeScaling& sc = r.scaling;
    if (s.contains("mrope_section") || type == "mrope") {
        int sum = 0;
        const bool list = s.contains("mrope_section") && s["mrope_section"].is_array() && !s["mrope_section"].empty();
        for (const nlohmann::json& v : list ? s["mrope_section"] : nlohmann::json::array()) {
            if (!v.is_number_integer() || v.get<int>() < 0)
                fail("'mrope_section' must be a list of pair counts (integers of at least 0)");
            sc.mropeSection.push_back(v.get<int>());
            sum += v.get<int>();
        }
        if (!list)
            fail("mrope scaling needs 'mrope_section', a list of pair counts");
        if (r.rotaryDim > 0 && 2 * sum != r.rotaryDim)
            fail("'mrope_section' covers " + std::to_string(sum) + " pairs where rotary_dim has " + std::to_string(r.rotaryDim / 2));
    }
    if (type == "linear")
        r.positionScale = positive(s, type, "factor", fail);
    else if (type == "llama3") {
        sc.type = RopeScalingType::Llama3;
        sc.factor = positive(s, type, "factor", fail);
        sc.lowFreqFactor = positive(s, type, "low_freq_factor", fail);
        sc.highFreqFactor = positive(s, type, "high_freq_factor", fail);
        sc.originalMaxPositions = positive(s, type, "original_max_position_embeddings", fail);
        if (sc.highFreqFactor < sc.lowFreqFactor)
            fail("llama3 scaling's 'high_freq_factor' must be at least its 'low_freq_factor'");
    } else if (type == "yarn") {
        sc.type = RopeScalingType::Yarn;
        sc.factor = positive(s, type, "factor", fail);
        sc.originalMaxPositions = positive(s, type, "original_max_position_embeddings", fail);
        // transformers: `get("beta_fast") or 32`, so 0 and null mean the default too.
        sc.betaFast = optionalNumber(s, type, "beta_fast", 0, fail);
        sc.betaSlow = optionalNumber(s, type, "beta_slow", 0, fail);
        sc.betaFast = sc.betaFast == 0 ? 32 : sc.betaFast;
        sc.betaSlow = sc.betaSlow == 0 ? 1 : sc.betaSlow;
        if (sc.betaFast < 0 || sc.betaSlow < 0)
            fail("yarn scaling's 'beta_fast' and 'beta_slow' must be positive");
        if (s.contains("truncate") && !s["truncate"].is_null() && !s["truncate"].is_boolean())
            fail("yarn scaling's 'truncate' must be true or false");
        sc.truncate = !s.contains("truncate") || s["truncate"].is_null() || s["truncate"].get<bool>();
        sc.attentionFactor = s.contains("attention_factor") && !s["attention_factor"].is_null()
                                 ? positive(s, type, "attention_factor", fail)
                                 : yarnAttentionFactor(sc.factor, optionalNumber(s, type, "mscale", 0, fail),
                                                       optionalNumber(s, type, "mscale_all_dim", 0, fail));
    } else if (type == "longrope") {
        sc.type = RopeScalingType::LongRope;
        sc.originalMaxPositions = positive(s, type, "original_max_position_embeddings", fail);
        sc.shortFactor = factors(s, "short_factor", r.rotaryDim, fail);
        sc.longFactor = factors(s, "long_factor", r.rotaryDim, fail);
        if (s.contains("attention_factor") && !s["attention_factor"].is_null())
            sc.attentionFactor = positive(s, type, "attention_factor", fail);
        else {
            sc.factor = positive(s, type, "factor", fail);
            sc.attentionFactor = longRopeAttentionFactor(sc.factor, sc.originalMaxPositions);
        }
    } else if (type == "dynamic") {
        sc.type = RopeScalingType::Dynamic;
        sc.factor = positive(s, type, "factor", fail);
        sc.maxPositions = positive(s, type, "max_position_embeddings", fail);
    }
}

}  // namespace

std::optional<RopeSettings> ropeSettingsOf(const BundleMetadata& metadata, const std::string& file)
{
    const auto it = metadata.extra.find("rope");
    if (it == metadata.extra.end())
        return std::nullopt;
    const Fail fail = [&](const std::string& what) { throw BundleError(file, "metadata attribute 'rope'", what); };
    nlohmann::json j;
    try {
        j = nlohmann::json::parse(it->second);
    } catch (const nlohmann::json::exception& e) {
        fail(std::string("not JSON (") + e.what() + ")");
    }
    if (!j.is_object() || !j.contains("theta") || !j["theta"].is_number() || j["theta"].get<double>() <= 1.0)
        fail("needs a number 'theta' above 1");
    RopeSettings r;
    r.theta = j["theta"].get<double>();
    if (j.contains("rotary_dim") && !j["rotary_dim"].is_null()) {
        if (!j["rotary_dim"].is_number_integer() || j["rotary_dim"].get<int>() < 2 || j["rotary_dim"].get<int>() % 2)
            fail("'rotary_dim' must be an even integer of at least 2");
        r.rotaryDim = j["rotary_dim"].get<int>();
    }
    if (j.contains("style") && !j["style"].is_null()) {
        const std::string style = j["style"].is_string() ? j["style"].get<std::string>() : "";
        if (style != "neox" && style != "gptj")
            fail("'style' must be \"neox\" (rotated halves) or \"gptj\" (interleaved pairs)");
        r.neoxStyle = style == "neox";
    }
    if (j.contains("scaling") && !j["scaling"].is_null())
        readScaling(j["scaling"], r, fail);
    return r;
}

RopeRotation::RopeRotation(const RopeSettings& rope, int dim, std::int64_t sequenceLength)
    : m_rope(rope)
    , m_dim(dim)
    , m_rotary(rope.rotaryDim > 0 && rope.rotaryDim <= dim ? rope.rotaryDim : dim)
{
    RopeScaling scaling = rope.scaling;
    // longrope's factors are one per pair of the rotary dims the bundle names: another width
    // (a head narrower than rotary_dim) rotates unscaled rather than read past them.
    if (scaling.type == RopeScalingType::LongRope &&
        (scaling.shortFactor.size() != std::size_t(m_rotary / 2) || scaling.longFactor.size() != std::size_t(m_rotary / 2)))
        scaling.type = RopeScalingType::Default;
    m_invFreq = ropeInverseFrequencies(rope.theta, m_rotary, scaling, sequenceLength);
    m_cos.resize(m_invFreq.size());
    m_sin.resize(m_invFreq.size());
}

void RopeRotation::setAngles(double position, double magnitude)
{
    const double pos = position / m_rope.positionScale;
    for (std::size_t i = 0; i < m_invFreq.size(); ++i) {
        m_cos[i] = magnitude * std::cos(pos * m_invFreq[i]);
        m_sin[i] = magnitude * std::sin(pos * m_invFreq[i]);
    }
}

void RopeRotation::setPosition(double position, bool inverse)
{
    const double a = m_rope.scaling.attentionFactor;
    if (a == 1.0)  // no factor: the angles exactly as before there was one
        setAngles(inverse ? -position : position, 1.0);
    else
        setAngles(inverse ? -position : position, inverse ? 1.0 / a : a);
}

void RopeRotation::setTurn(double positions)
{
    setAngles(positions, 1.0);
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
