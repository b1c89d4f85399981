#include "synth/synthetic_provenance.h"

#include "format/provenance.h"

#include <nlohmann/json.hpp>

#include <charconv>
#include <sstream>
#include <stdexcept>

namespace kvscope::synth {

std::string provenanceFromSpec(const std::string& spec, std::int64_t promptLen, std::int64_t decodeTokens)
{
    nlohmann::json ranges = nlohmann::json::array();
    std::int64_t at = 0, chunk = 0;
    std::stringstream in(spec);
    for (std::string segment; std::getline(in, segment, ',');) {
        const std::string where = "--provenance: segment '" + segment + "'";
        std::string kindAndDetail = segment;
        std::int64_t count = promptLen - at;  // no COUNT: the rest
        if (const std::size_t colon = segment.find(':'); colon != std::string::npos) {
            kindAndDetail = segment.substr(0, colon);
            const char* first = segment.data() + colon + 1;
            const char* last = segment.data() + segment.size();
            const auto [end, ec] = std::from_chars(first, last, count);
            if (ec != std::errc() || end != last || count < 1)
                throw std::invalid_argument(where + ": the count after ':' must be a positive number of positions");
        }
        std::string kindName = kindAndDetail, detail;
        if (const std::size_t eq = kindAndDetail.find('='); eq != std::string::npos) {
            kindName = kindAndDetail.substr(0, eq);
            detail = kindAndDetail.substr(eq + 1);
        }
        const std::optional<ProvenanceKind> kind = provenanceKindNamed(kindName);
        if (!kind || *kind == ProvenanceKind::Decode || *kind == ProvenanceKind::SpecAccepted)
            throw std::invalid_argument(where + ": the kind must be prefill, prefix_cache, external=CONNECTOR, recomputed or "
                                                "unknown (positions after the prompt are decode steps)");
        if ((*kind == ProvenanceKind::External) != !detail.empty())
            throw std::invalid_argument(where + (detail.empty() ? ": external names its connector (external=NixlConnector)"
                                                                : ": only external takes =DETAIL"));
        const std::int64_t end = std::min(promptLen, at + count);
        if (end <= at)
            continue;  // past this prompt's end
        nlohmann::json r = {{"start", at}, {"end", end}, {"kind", kindName}};
        if (*kind == ProvenanceKind::Prefill)
            r["chunk"] = chunk++;
        if (*kind == ProvenanceKind::External)
            r["connector"] = detail;
        if (*kind == ProvenanceKind::Recomputed)
            r["preemption"] = 0;
        ranges.push_back(r);
        at = end;
    }
    for (std::int64_t step = 0; step < decodeTokens; ++step)
        ranges.push_back({{"start", promptLen + step}, {"end", promptLen + step + 1}, {"kind", "decode"}, {"step", step}});
    return ranges.dump();
}

}  // namespace kvscope::synth
