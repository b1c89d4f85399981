#include "analysis/analysis_json.h"

#include "analysis/suspects.h"
#include "util/utf8.h"

#include <charconv>
#include <cmath>

namespace kvscope {

std::string jsonString(const std::string& text)
{
    std::string s = "\"";
    for (std::size_t i = 0; i < text.size();) {
        const unsigned char c = static_cast<unsigned char>(text[i]);
        const std::size_t n = utf8SequenceLength(text, i);
        if (n == 0) {  // not UTF-8 (names come from files): the byte as the text \xNN, so the JSON stays valid
            s += "\\\\" + escapedByte(c).substr(1);
            ++i;
            continue;
        }
        if (n > 1) {
            s.append(text, i, n);
            i += n;
            continue;
        }
        ++i;
        switch (c) {
        case '"': s += "\\\""; break;
        case '\\': s += "\\\\"; break;
        case '\n': s += "\\n"; break;
        case '\r': s += "\\r"; break;
        case '\t': s += "\\t"; break;
        default:
            if (c < 0x20) {
                char buf[8];
                std::snprintf(buf, sizeof buf, "\\u%04x", c);
                s += buf;
            } else {
                s += char(c);
            }
        }
    }
    return s + "\"";
}

namespace {

class JsonWriter {
public:
    explicit JsonWriter(std::ostream& out) : m_out(out) {}

    void number(float v)
    {
        if (!std::isfinite(v)) {
            m_out << "null";
            return;
        }
        char buf[32];
        const auto r = std::to_chars(buf, buf + sizeof buf, v);  // shortest round-trip form
        m_out.write(buf, r.ptr - buf);
    }
    void number(double v)
    {
        if (!std::isfinite(v)) {
            m_out << "null";
            return;
        }
        char buf[40];
        const auto r = std::to_chars(buf, buf + sizeof buf, v);
        m_out.write(buf, r.ptr - buf);
    }
    void integer(std::int64_t v) { m_out << v; }

    // A nested array [outer][inner] of `values` (row-major), `group` values per innermost array.
    void floatArray(const float* values, std::size_t count)
    {
        m_out << '[';
        for (std::size_t i = 0; i < count; ++i) {
            if (i)
                m_out << ',';
            number(values[i]);
        }
        m_out << ']';
    }
    template <typename Fn>
    void array(std::size_t count, Fn&& item)
    {
        m_out << '[';
        for (std::size_t i = 0; i < count; ++i) {
            if (i)
                m_out << ',';
            item(i);
        }
        m_out << ']';
    }
    std::ostream& raw() { return m_out; }

private:
    std::ostream& m_out;
};

void writeStrings(JsonWriter& w, const std::vector<std::string>& strings)
{
    w.array(strings.size(), [&](std::size_t i) { w.raw() << jsonString(strings[i]); });
}

template <typename T>
void writeOptional(JsonWriter& w, const char* key, const std::optional<T>& value)
{
    w.raw() << ",\"" << key << "\":";
    if (!value)
        w.raw() << "null";
    else if constexpr (std::is_same_v<T, bool>)
        w.raw() << (*value ? "true" : "false");
    else if constexpr (std::is_same_v<T, double>)
        w.number(*value);
    else
        w.integer(*value);
}

void writeSuspects(JsonWriter& w, const std::vector<Suspect>& suspects)
{
    std::ostream& o = w.raw();
    auto ints = [&](const std::vector<int>& v) { w.array(v.size(), [&](std::size_t i) { w.integer(v[i]); }); };
    w.array(suspects.size(), [&](std::size_t i) {
        const Suspect& s = suspects[i];
        o << "{\"pattern\":\"" << suspectPatternName(s.pattern) << "\",\"score\":";
        w.number(s.score);
        o << ",\"evidence\":" << jsonString(s.evidence) << ",\"prompts\":";
        writeStrings(w, s.prompts);
        o << ",\"first_layer\":" << jsonString(s.firstLayer) << ",\"layers\":";
        writeStrings(w, s.layers);
        o << ",\"kv\":\"" << s.kv << "\",\"heads\":";
        ints(s.heads);
        o << ",\"tp_ranks\":";
        ints(s.tpRanks);
        o << ",\"tokens\":";
        if (s.firstToken < 0)
            o << "null";
        else
            o << '[' << s.firstToken << ',' << s.lastToken << ']';
        o << ",\"phase\":\"" << s.phase << "\",\"blocks\":";
        w.array(s.blocks.size(), [&](std::size_t b) {
            o << "{\"group\":" << s.blocks[b].group << ",\"logical\":" << s.blocks[b].logical << ",\"physical\":";
            if (s.blocks[b].physical < 0)
                o << "null";
            else
                o << s.blocks[b].physical;
            o << '}';
        });
        o << ",\"worst_cell\":{\"layer\":" << s.worstLayer << ",\"token\":" << s.worstToken << ",\"head\":"
          << s.worstHead << ",\"part\":\"" << kvPartName(s.worstPart) << "\"}}";
    });
}

void writePrompt(JsonWriter& w, const PromptAnalysis& p)
{
    std::ostream& o = w.raw();
    o << "{\"id\":" << jsonString(p.id) << ",\"mode\":\"" << (p.threeWay ? "three-way" : "two-way")
      << "\",\"prompt_len\":" << p.promptLen << ",\"num_tokens\":" << p.tokens << ",\"num_heads\":" << p.heads
      << ",\"head_dim\":" << p.headDim << ",\"layer_names\":";
    writeStrings(w, p.layers);
    o << ",\"layer_groups\":";
    w.array(p.layerGroups.size(), [&](std::size_t i) { w.integer(p.layerGroups[i]); });
    o << ",\"divergence_positions\":";
    w.array(p.divergences.size(), [&](std::size_t i) { w.integer(p.divergences[i].position); });
    o << ",\"divergences\":";
    w.array(p.divergences.size(), [&](std::size_t i) {
        const Divergence& d = p.divergences[i];
        o << "{\"position\":" << d.position << ",\"derived\":" << (d.derived ? "true" : "false");
        writeOptional(w, "engine_token", d.engineToken);
        writeOptional(w, "teacher_token", d.teacherToken);
        writeOptional(w, "logit_gap", d.logitGap);
        writeOptional(w, "ulp_bound", d.ulpBound);
        writeOptional(w, "in_bounds", d.inBounds);
        o << '}';
    });

    const std::size_t layers = p.layers.size(), tokens = std::size_t(p.tokens), heads = std::size_t(p.heads);
    o << ",\"metrics\":{";
    bool first = true;
    for (int m = 0; m < kMetricCount; ++m) {
        if (isBaseMetric(Metric(m)) && !p.threeWay)
            continue;
        o << (first ? "" : ",") << '"' << metricName(Metric(m)) << "\":";
        first = false;
        const float* data = p.metrics[std::size_t(m)].data();
        w.array(layers, [&](std::size_t l) {
            w.array(tokens, [&](std::size_t t) { w.floatArray(data + (l * tokens + t) * heads, heads); });
        });
    }
    o << '}';
    if (p.threeWay) {
        o << ",\"bc\":{";
        for (int part = 0; part < 2; ++part) {
            o << (part ? ",\"v_bc\":" : "\"k_bc\":");
            const float* data = p.bc[std::size_t(part)].data();
            w.array(layers, [&](std::size_t l) { w.floatArray(data + l * tokens, tokens); });
        }
        o << "},\"bc_vs_noise\":{";
        for (int part = 0; part < 2; ++part) {
            o << (part ? ",\"v\":" : "\"k\":");
            const float* data = p.bcVsNoise[std::size_t(part)].data();
            w.array(layers, [&](std::size_t l) { w.floatArray(data + l * tokens, tokens); });
        }
        o << '}';
    }
    o << ",\"suspects\":";
    writeSuspects(w, p.suspects);
    o << ",\"problems\":";
    writeStrings(w, p.problems);
    o << ",\"non_finite\":";
    w.array(p.nonFinite.size(), [&](std::size_t i) {
        const NonFiniteCell& c = p.nonFinite[i];
        o << "{\"layer\":" << c.layer << ",\"token\":" << c.token << ",\"head\":" << c.head << ",\"part\":\""
          << kvPartName(c.part) << "\",\"side\":" << jsonString(c.side) << '}';
    });
    o << '}';
}

}  // namespace

void writeAnalysisJson(const AnalysisResult& result, std::ostream& out)
{
    JsonWriter w(out);
    out << "{\"format\":\"kvscope-analysis\",\"format_version\":1,\"bundle\":" << jsonString(result.bundle)
        << ",\"layout\":{\"metrics\":\"[layer][token][head]\",\"bc\":\"[layer][token]\",\"aggregate_bc\":"
           "\"[layer][generation_index]\"},\"problems\":";
    writeStrings(w, result.problems);
    out << ",\"suspects\":";
    writeSuspects(w, result.suspects);
    out << ",\"prompts\":";
    w.array(result.prompts.size(), [&](std::size_t i) { writePrompt(w, result.prompts[i]); });
    out << ",\"aggregate\":";
    if (!result.aggregate) {
        out << "null}";
        return;
    }
    const AggregateBc& a = *result.aggregate;
    const std::size_t g = std::size_t(a.generationCount);
    out << "{\"prompt_ids\":";
    writeStrings(w, a.promptIds);
    out << ",\"layer_names\":";
    writeStrings(w, a.layers);
    out << ",\"num_generation_indices\":" << a.generationCount << ",\"divergence_counts\":";
    w.array(a.divergenceCounts.size(), [&](std::size_t i) { w.integer(a.divergenceCounts[i]); });
    for (int part = 0; part < 2; ++part) {
        out << (part ? ",\"v_bc\":" : ",\"k_bc\":");
        w.array(a.layers.size(), [&](std::size_t l) { w.floatArray(a.bc[std::size_t(part)].data() + l * g, g); });
    }
    out << ",\"combined_k_bc\":";
    w.floatArray(a.combined[0].data(), a.layers.size());
    out << ",\"combined_v_bc\":";
    w.floatArray(a.combined[1].data(), a.layers.size());
    for (int part = 0; part < 2; ++part) {
        out << (part ? ",\"v_bc_vs_noise\":" : ",\"k_bc_vs_noise\":");
        w.array(a.layers.size(), [&](std::size_t l) { w.floatArray(a.bcVsNoise[std::size_t(part)].data() + l * g, g); });
    }
    out << ",\"combined_k_bc_vs_noise\":";
    w.floatArray(a.combinedVsNoise[0].data(), a.layers.size());
    out << ",\"combined_v_bc_vs_noise\":";
    w.floatArray(a.combinedVsNoise[1].data(), a.layers.size());
    out << "}}\n";
}

}  // namespace kvscope
