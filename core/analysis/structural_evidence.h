#pragma once
// Structural detectors: where the error lies against the engine's own structure, said as
// evidence with its statistic (docs/suspects.md "Structure"). They place the off positions;
// what the values are is still the hypothesis's to say. Each says something only when the
// structure accounts for every off position it looks at, and nothing otherwise.
// - last_block_fill, across the capture's prompts: the off positions are the first decode
//   positions of exactly the prompts whose last block was at most so full (prompt_len mod
//   block_size), and no other prompt has any (int8 per-token-head caches corrupting the first
//   generated tokens when prompt_len mod 16 is 0-8);
// - chunk_boundary, in one prompt whose provenance records its prefill chunks: the error starts
//   exactly at a chunk's first position, off from there on, quiet before.

#include "analysis/analysis_result.h"
#include "analysis/suspect.h"
#include "format/kv_cache_config.h"
#include "format/provenance.h"

#include <cstdint>
#include <optional>
#include <set>
#include <vector>

namespace kvscope {

// last_block_fill holds only when a split this clean has at most this chance: the off prompts
// any k of the n, the chance that they are exactly those with the least full last blocks.
constexpr double kStructureChance = 0.1;

// A prompt and the suspects found in it: the analysis's own (PromptAnalysis::suspects), or
// kvscope diff's suspects of the change.
struct PromptSuspects {
    const PromptAnalysis* prompt = nullptr;
    const std::vector<Suspect>* suspects = nullptr;
};

// The capture's prompts and the pooled suspect to place (its first layer and prompts). Every
// prompt needs a finite suspect in that layer starting at its first decode position and ending
// within a block of it, or none at all; two of each at least.
std::optional<StructuralFinding> lastBlockFillOf(const std::vector<PromptSuspects>& prompts, const KvCacheConfig& config,
                                                 const Suspect& pooled);

// The chunk boundary the onset's off positions step at: `off` the off positions, `analysed`
// the positions compared there (sorted), `promptLen` the prompt's length. The first off position
// is a chunk's start (chunk 1 or later), at least two analysed positions lie before it, and at
// least nine tenths of the analysed positions of that chunk and the prefill chunks after it are off.
std::optional<StructuralFinding> chunkBoundaryOf(const std::vector<ProvenanceRange>& ranges,
                                                 const std::set<std::int64_t>& off,
                                                 const std::vector<std::int64_t>& analysed, std::int64_t promptLen);

// The pooled suspects given the structure found in `prompts`: the top finite suspect's
// last_block_fill, said in its evidence (Suspect::structure).
// (kvscope diff: the suspects of the change, each prompt's own list.)
void addStructuralEvidence(std::vector<Suspect>& pooled, const std::vector<PromptSuspects>& prompts,
                           const KvCacheConfig& config);
void addStructuralEvidence(std::vector<Suspect>& pooled, const std::vector<PromptAnalysis>& prompts,
                           const KvCacheConfig& config);

}  // namespace kvscope
