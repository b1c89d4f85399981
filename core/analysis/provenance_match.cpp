#include "analysis/provenance_match.h"

#include <algorithm>
#include <set>

namespace kvscope {

namespace {

// One source: the kind, and for a connector which one (two connectors are two paths).
bool sameSource(const ProvenanceRange& a, const ProvenanceRange& b)
{
    return a.kind == b.kind && a.connector == b.connector;
}

std::string runs(const std::set<std::int64_t>& ids)
{
    std::string text;
    for (auto it = ids.begin(); it != ids.end();) {
        const std::int64_t first = *it;
        std::int64_t last = first;
        while (++it != ids.end() && *it == last + 1)
            ++last;
        text += (text.empty() ? "" : ", ") + std::to_string(first) + (last > first ? "-" + std::to_string(last) : "");
    }
    return text;
}

std::string howItCame(const ProvenanceMatch& m)
{
    std::set<std::int64_t> blocks(m.blocks.begin(), m.blocks.end()), chunks(m.chunks.begin(), m.chunks.end());
    switch (m.kind) {
    case ProvenanceKind::Prefill:
        return "was computed here in prefill" +
               (chunks.empty() ? std::string() : (chunks.size() == 1 ? " chunk " : " chunks ") + runs(chunks));
    case ProvenanceKind::PrefixCache:
        return "was served from the prefix cache" + (blocks.empty() ? std::string() : " (blocks " + runs(blocks) + ")");
    case ProvenanceKind::External:
        return "was loaded by " + m.connector;
    case ProvenanceKind::Decode:
        return "was computed here in decode steps";
    case ProvenanceKind::SpecAccepted:
        return "was an accepted speculative draft";
    case ProvenanceKind::Recomputed:
        return "was recomputed after a preemption";
    case ProvenanceKind::Unknown:
        break;
    }
    return {};
}

}  // namespace

std::optional<ProvenanceMatch> matchProvenance(const std::vector<ProvenanceRange>& ranges,
                                               const std::vector<std::int64_t>& offPositions,
                                               const std::vector<std::int64_t>& analysed)
{
    if (ranges.empty() || offPositions.empty())
        return std::nullopt;
    const ProvenanceRange* source = nullptr;
    ProvenanceMatch m;
    std::set<std::int64_t> blocks, chunks;
    for (std::int64_t position : offPositions) {
        const ProvenanceRange* r = provenanceAt(ranges, position);
        if (!r || r->kind == ProvenanceKind::Unknown)
            return std::nullopt;  // a position whose path was not recorded: no claim
        if (source && !sameSource(*source, *r))
            return std::nullopt;  // the off positions span paths
        source = r;
        blocks.insert(r->blocks.begin(), r->blocks.end());
        if (r->chunk)
            chunks.insert(*r->chunk);
    }
    // Another path among the analysed positions, clean: otherwise the path tells nothing apart.
    const bool otherPath = std::any_of(analysed.begin(), analysed.end(), [&](std::int64_t position) {
        const ProvenanceRange* r = provenanceAt(ranges, position);
        return r && r->kind != ProvenanceKind::Unknown && !sameSource(*r, *source);
    });
    if (!otherPath)
        return std::nullopt;
    m.kind = source->kind;
    m.connector = source->connector;
    m.blocks.assign(blocks.begin(), blocks.end());
    m.chunks.assign(chunks.begin(), chunks.end());
    m.firstOff = *std::min_element(offPositions.begin(), offPositions.end());
    m.lastOff = *std::max_element(offPositions.begin(), offPositions.end());
    m.text = "Every off position (" + std::to_string(m.firstOff) +
             (m.lastOff > m.firstOff ? "-" + std::to_string(m.lastOff) : std::string()) + ") " + howItCame(m) +
             "; the positions that came another way are within the noise.";
    return m;
}

}  // namespace kvscope
