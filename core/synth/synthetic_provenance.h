#pragma once
// kvscope synth --provenance SPEC: a made capture that records where each position's KV came
// from (format/provenance.h), so that the analysis by source, the suspects' provenance lead and
// the app's provenance strip can be tried without an engine.
//
// SPEC lists the prompt's sources in position order, comma-separated, each KIND[=DETAIL][:COUNT]:
// prefill, prefix_cache, external=CONNECTOR, recomputed or unknown, COUNT positions long (the last
// without COUNT: the rest of the prompt). Prefill segments are chunks 0, 1, ... in order. A
// segment past the prompt's end is cut there; positions after the prompt are decode steps.

#include <cstdint>
#include <string>

namespace kvscope::synth {

// The prompt's `provenance` attribute (JSON). Throws std::invalid_argument naming what in the
// spec is wrong.
std::string provenanceFromSpec(const std::string& spec, std::int64_t promptLen, std::int64_t decodeTokens);

}  // namespace kvscope::synth
