#pragma once
// Where each position's KV came from, as the capture recorded it: the prompt's optional
// `provenance` attribute (docs/bundle-format.md), ranges of positions each with one source.
// Bugs of a prefix-cache hit, an external connector's load, a chunked prefill's later chunks or
// spec decoding's rejected drafts depend on the path that wrote the KV more than on its values;
// with the path recorded, an analysis can say "every off position was loaded by the connector".

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace kvscope {

enum class ProvenanceKind {
    Prefill,       // computed here in a prefill step (details: its chunk)
    PrefixCache,   // a local prefix-cache hit (details: its physical blocks)
    External,      // loaded by a KV connector (details: which)
    Decode,        // computed here in a decode step (details: the step)
    SpecAccepted,  // a speculative draft token the verifier accepted (details: the step)
    Recomputed,    // computed again after a preemption
    Unknown,
};
const char* provenanceKindName(ProvenanceKind kind);  // "prefill", "prefix_cache", ...
std::optional<ProvenanceKind> provenanceKindNamed(const std::string& name);  // none: not a kind

struct ProvenanceRange {
    std::int64_t start = 0, end = 0;  // positions [start, end)
    ProvenanceKind kind = ProvenanceKind::Unknown;
    std::optional<std::int64_t> chunk;      // prefill
    std::vector<std::int64_t> blocks;       // prefix_cache: the physical blocks served
    std::string connector;                  // external: e.g. "LMCacheConnectorV1", "NixlConnector"
    std::optional<std::int64_t> step;       // decode, spec_accepted: the engine step
    std::optional<std::int64_t> preemption; // recomputed: which preemption (0 = the first)
};

// The attribute's JSON: [{"start": 0, "end": 128, "kind": "prefix_cache", "blocks": [17, 18]}, ...],
// ranges increasing and not overlapping, within [0, positions) (positions not covered are of
// unknown source). Throws std::invalid_argument saying what is wrong (the reader names the file
// and the prompt).
std::vector<ProvenanceRange> parseProvenance(const std::string& json, std::int64_t positions);

// The source of `position` (Unknown where no range covers it).
const ProvenanceRange* provenanceAt(const std::vector<ProvenanceRange>& ranges, std::int64_t position);

// One line a range, neighbours of one kind and the same details merged (a decode range a step):
// "0-99 prefill (chunk 0)", "100-127 external (LMCacheConnectorV1)", "128-139 decode (steps 0-11)".
std::vector<std::string> describeProvenance(const std::vector<ProvenanceRange>& ranges);

}  // namespace kvscope
