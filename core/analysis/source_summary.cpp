#include "analysis/source_summary.h"

#include <map>

namespace kvscope {

std::string sourceOf(const ProvenanceRange& range)
{
    std::string source = provenanceKindName(range.kind);
    if (range.kind == ProvenanceKind::Prefill && range.chunk)
        source += " (chunk " + std::to_string(*range.chunk) + ")";
    else if (range.kind == ProvenanceKind::External)
        source += " (" + range.connector + ")";
    else if (range.kind == ProvenanceKind::Recomputed && range.preemption)
        source += " (after preemption " + std::to_string(*range.preemption) + ")";
    return source;
}

std::vector<SourceSummary> summarizeBySource(const PromptAnalysis& p, const std::vector<ProvenanceRange>& provenance,
                                             const std::vector<double>& offThresholds, const CellRatioMaxima* given)
{
    std::vector<SourceSummary> sources;
    if (provenance.empty())
        return sources;
    const std::size_t layers = p.layers.size();
    // Each position's source, as an index into `sources`.
    std::vector<std::size_t> sourceAt(std::size_t(p.tokens));
    std::map<std::string, std::size_t> indexOf;
    for (std::int64_t t = 0; t < p.tokens; ++t) {
        const ProvenanceRange* range = provenanceAt(provenance, t);
        const std::string name = range ? sourceOf(*range) : provenanceKindName(ProvenanceKind::Unknown);
        auto [it, added] = indexOf.emplace(name, sources.size());
        if (added) {
            SourceSummary s;
            s.source = name;
            s.kind = range ? range->kind : ProvenanceKind::Unknown;
            s.layerWorst.assign(layers, std::nanf(""));
            sources.push_back(std::move(s));
        }
        SourceSummary& s = sources[it->second];
        sourceAt[std::size_t(t)] = it->second;
        if (!s.spans.empty() && s.spans.back().second == t)
            ++s.spans.back().second;
        else
            s.spans.push_back({t, t + 1});
        ++s.positions;
    }

    CellRatioMaxima computed;
    if (!given)
        computed = cellRatioMaxima(p);
    const CellRatioMaxima& ratios = given ? *given : computed;
    for (std::size_t l = 0; l < layers; ++l) {
        const double threshold = l < offThresholds.size() ? offThresholds[l] : std::nan("");
        for (std::int64_t t = 0; t < p.tokens; ++t) {
            SourceSummary& s = sources[sourceAt[std::size_t(t)]];
            for (KvPart part : {KvPart::K, KvPart::V}) {
                const float r = ratios[std::size_t(part)][l * std::size_t(p.tokens) + std::size_t(t)];
                if (!std::isfinite(r))
                    continue;
                ++s.cells;
                s.offCells += double(r) > threshold ? 1 : 0;
                if (!(r <= s.layerWorst[l]))
                    s.layerWorst[l] = r;
                if (!(r <= s.worstRatio)) {
                    s.worstRatio = r;
                    s.worstLayer = int(l);
                    s.worstToken = t;
                    s.worstPart = part;
                }
            }
        }
        p.releaseLayer(int(l));
    }
    for (const NonFiniteCell& c : p.nonFinite)
        if (c.token >= 0 && c.token < p.tokens)
            ++sources[sourceAt[std::size_t(c.token)]].nonFinite;
    return sources;
}

std::string spanText(const std::vector<std::pair<std::int64_t, std::int64_t>>& spans)
{
    std::string text;
    for (const auto& [start, end] : spans)
        text += (text.empty() ? "" : ", ") + std::to_string(start) + (end - start > 1 ? "-" + std::to_string(end - 1) : "");
    return text;
}

}  // namespace kvscope
