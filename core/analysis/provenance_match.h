#pragma once
// Whether a suspect's off positions are one source's (format/provenance.h): every off position
// of the onset layer came by the same path (the prefix cache, one connector, decode, ...), and
// the positions that came by other paths are within the noise. Then the path is the lead: "every
// off position (128-191) was loaded by LMCacheConnectorV1". Nothing is said when the off
// positions span sources, when a position of theirs has no recorded source, or when one source
// covers every analysed position (it would say nothing).

#include "format/provenance.h"

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace kvscope {

struct ProvenanceMatch {
    ProvenanceKind kind = ProvenanceKind::Unknown;
    std::string connector;                 // external: which
    std::vector<std::int64_t> blocks;      // prefix_cache: the blocks of the off positions' ranges
    std::vector<std::int64_t> chunks;      // prefill: the chunks the off positions fall in
    std::int64_t firstOff = 0, lastOff = 0;
    std::string text;  // the sentence
};

// `offPositions`: the onset layer's off positions (any order, repeats allowed); `analysed`: the
// positions the analysis compared there (the sources' other positions among them are clean).
std::optional<ProvenanceMatch> matchProvenance(const std::vector<ProvenanceRange>& ranges,
                                               const std::vector<std::int64_t>& offPositions,
                                               const std::vector<std::int64_t>& analysed);

}  // namespace kvscope
