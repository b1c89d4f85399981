// The analysis JSON writer's round trip: an analysis built from the input's bytes (any float
// bit pattern, NaN and Inf included; names of any bytes, as files can hold) is written and
// parsed back strictly. The JSON must parse, finite numbers come back exactly, NaN and Inf
// as null, and text exactly (bytes that are not UTF-8 as the text \xNN).

#include "analysis/analysis_json.h"
#include "util/json_writer.h"
#include "util/utf8.h"

#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <sstream>

namespace {

// Hands out the input's bytes as values; zeros once they run out.
class ByteSource {
public:
    ByteSource(const std::uint8_t* data, std::size_t size) : m_data(data), m_size(size) {}
    std::uint8_t byte() { return m_at < m_size ? m_data[m_at++] : 0; }
    float number()
    {
        std::uint32_t bits = 0;
        for (int i = 0; i < 4; ++i)
            bits = bits << 8 | byte();
        float v;
        std::memcpy(&v, &bits, 4);
        return v;
    }
    std::string text()
    {
        std::string s(byte() % 12, '\0');
        for (char& c : s)
            c = char(byte());
        return s;
    }

private:
    const std::uint8_t* m_data;
    std::size_t m_size;
    std::size_t m_at = 0;
};

std::string expectedText(const std::string& text)
{
    std::string out;
    for (std::size_t i = 0; i < text.size();) {
        const std::size_t n = kvscope::utf8SequenceLength(text, i);
        out += n ? text.substr(i, n) : kvscope::escapedByte(static_cast<unsigned char>(text[i]));
        i += n ? n : 1;
    }
    return out;
}

void require(bool ok)
{
    if (!ok)
        __builtin_trap();
}

void requireText(const nlohmann::json& value, const std::string& original)
{
    require(value.is_string() && value.get<std::string>() == expectedText(original));
}

void requireNumber(const nlohmann::json& value, float original)
{
    if (!std::isfinite(original))
        return require(value.is_null());
    require(value.is_number() && float(value.get<double>()) == original);
}

// Nested arrays flattened in order.
void flatten(const nlohmann::json& value, std::vector<nlohmann::json>& out)
{
    if (value.is_array())
        for (const auto& item : value)
            flatten(item, out);
    else
        out.push_back(value);
}

void requireNumbers(const nlohmann::json& value, const kvscope::SpillableArray& original)
{
    std::vector<nlohmann::json> flat;
    flatten(value, flat);
    require(flat.size() == original.size());
    for (std::size_t i = 0; i < flat.size(); ++i)
        requireNumber(flat[i], original[i]);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size)
{
    using namespace kvscope;
    ByteSource in(data, size);
    AnalysisResult result;
    result.bundle = in.text();
    result.problems = {in.text()};
    PromptAnalysis& p = result.prompts.emplace_back();
    p.id = in.text();
    p.threeWay = in.byte() & 1;
    const int layers = 1 + in.byte() % 3;
    p.tokens = 1 + in.byte() % 4;
    p.heads = 1 + in.byte() % 3;
    p.dims = 8;
    p.promptLen = 1;
    for (int l = 0; l < layers; ++l) {
        p.layers.push_back(in.text());
        p.layerGroups.push_back(0);
    }
    p.allocate();
    for (auto& metric : p.metrics)
        for (float& v : metric)
            v = in.number();
    for (auto* values : {&p.bc, &p.bcVsNoise})
        for (auto& part : *values)
            for (float& v : part)
                v = in.number();
    p.problems = {in.text()};
    if (in.byte() & 1) {
        Divergence& d = p.divergences.emplace_back();
        d.position = in.byte();
        d.logitGap = in.number();
    }

    std::ostringstream out;
    writeAnalysisJson(result, out);
    nlohmann::json parsed;
    try {
        parsed = nlohmann::json::parse(out.str());
    } catch (const nlohmann::json::exception& e) {
        std::fprintf(stderr, "not strict JSON (%s):\n%s\n", e.what(), out.str().c_str());
        __builtin_trap();
    }
    requireText(parsed["bundle"], result.bundle);
    requireText(parsed["problems"][0], result.problems[0]);
    const nlohmann::json& prompt = parsed["prompts"][0];
    requireText(prompt["id"], p.id);
    requireText(prompt["problems"][0], p.problems[0]);
    for (int l = 0; l < layers; ++l)
        requireText(prompt["layer_names"][std::size_t(l)], p.layers[std::size_t(l)]);
    for (int m = 0; m < kMetricCount; ++m)
        if (p.threeWay || !isBaseMetric(Metric(m)))
            requireNumbers(prompt["metrics"][metricName(Metric(m))], p.metrics[std::size_t(m)]);
    if (p.threeWay) {
        requireNumbers(prompt["bc"]["k_bc"], p.bc[0]);
        requireNumbers(prompt["bc"]["v_bc"], p.bc[1]);
        requireNumbers(prompt["bc_vs_noise"]["k"], p.bcVsNoise[0]);
        requireNumbers(prompt["bc_vs_noise"]["v"], p.bcVsNoise[1]);
    }
    if (!p.divergences.empty())
        requireNumber(prompt["divergences"][0]["logit_gap"], float(*p.divergences[0].logitGap));
    return 0;
}
