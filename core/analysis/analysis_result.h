#pragma once
// What an analysis produces, as plain values: per prompt, the per-(layer, token, head)
// metrics and per-(layer, token) Bhattacharyya coefficients; across prompts, the BC
// aggregated by generation index and combined per layer. NaN means "no data" (absent
// position, layer not analysed) everywhere: reductions skip it, JSON writes null.

#include "analysis/state_analysis.h"
#include "analysis/suspect.h"
#include "format/impact_record.h"
#include "format/dtype.h"
#include "format/raw_tensor.h"
#include "format/paged_kv.h"
#include "format/provenance.h"
#include "kv/layer_kv.h"
#include "kv/replica_check.h"
#include "kv/sweep.h"
#include "util/spillable_array.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace kvscope {

// Actual metrics (the engine vs the reference) and base metrics (expected vs baseline, three-way only).
enum class Metric {
    KCos, VCos, KLinf, VLinf, KL2, VL2,
    BaseKCos, BaseVCos, BaseKLinf, BaseVLinf, BaseKL2, BaseVL2,
};
inline constexpr int kMetricCount = 12;
// The reference tool's names: k_cos, v_cos, k_linf, ..., base_k_linf, ...
const char* metricName(Metric metric);
bool isBaseMetric(Metric metric);
// The base metric measuring the same thing as an actual metric (KLinf -> BaseKLinf).
Metric baseOf(Metric metric);
enum class MetricKind { Cos, Linf, L2 };
Metric metricFor(KvPart part, MetricKind kind);

struct Divergence {
    std::int64_t position = 0;   // absolute
    bool derived = false;         // found from logits, not recorded in the bundle
    std::optional<std::int64_t> engineToken;
    std::optional<std::int64_t> teacherToken;
    std::optional<double> logitGap;  // engine logit of its token minus that of the teacher token
    std::optional<double> ulpBound;  // n_ulps * 2^(floor(log2|v|) - mantissa_bits), bf16
    std::optional<bool> inBounds;
};

struct NonFiniteCell {
    int layer = 0;
    std::int64_t token = 0;
    int head = 0;
    KvPart part = KvPart::K;
    // The input that holds it: "actual" (the engine's cache), "expected" or "baseline" (the
    // reference sides: two-way the engine is compared against expected).
    std::string side;
    std::string value{};  // "nan", "inf" or "-inf" (NaN if any, else the first infinity); empty: not said (older JSON)
};

// How a layer's quantised cache is scaled, as the bundle says: the granularity and, unless it
// is per token, each head's scale for K and V.
struct CacheScales {
    ScaleGranularity granularity = ScaleGranularity::Tensor;
    std::array<std::vector<float>, 2> heads;  // [K/V][head]; empty: not quantised, or not read
};

struct PromptAnalysis {
    std::string id;
    std::vector<std::int64_t> inputIds;  // the prompt's tokens as the bundle holds them
    // Fingerprints of the reference compared against (util/content_hash.h), per analysed layer:
    // [expected, baseline][layer]; 0 where not read (and baseline for a two-way prompt).
    std::array<std::vector<std::uint64_t>, 2> referenceHashes;
    std::int64_t promptLen = 0;
    std::int64_t tokens = 0;
    int heads = 0;  // the head axis: the most any analysed layer has
    // Per analysed layer: its own KV heads (groups may differ); the cells of heads past them are absent.
    std::vector<int> layerHeads;
    HeadDims dims;  // of K and V (MLA: c_kv and k_pe) in the first analysed layer
    std::vector<HeadDims> layerDims;  // per analysed layer (groups may differ in head size)
    // What K and V are called: "k", "v", or an MLA cache's "c_kv", "k_pe".
    std::array<std::string, 2> partNames{"k", "v"};
    bool threeWay = false;
    std::vector<std::string> layers;  // analysed layers, in model order
    std::vector<int> layerGroups;
    std::vector<DType> layerDtypes;   // the engine cache's storage dtype per layer
    std::vector<CacheScales> cacheScales;  // [layer], for quantised caches
    std::vector<Divergence> divergences;
    std::vector<ProvenanceRange> provenance;  // where each position's KV came from, as captured (may be empty)
    // Tens of megabytes for a large model at 2k tokens, gigabytes at 128k: then spilled to a
    // temporary file (allocate()), and released a layer at a time by what reads them.
    std::array<SpillableArray, kMetricCount> metrics;  // [layer][token][head]
    std::array<SpillableArray, 2> bc;                  // [K/V][layer][token], the reference tool's
    std::array<SpillableArray, 2> bcVsNoise;           // [K/V][layer][token] (metrics/bc_vs_noise.h)
    // Where the engine stores KV quantised: what quantising the reference the way the cache
    // stores it (its format, its own scales) costs, max over heads, in the analysis's L-inf and
    // L2 (three-way: expected quantised, against the baseline). NaN elsewhere. Empty when no
    // layer is quantised.
    std::array<SpillableArray, 2> quantLinf;           // [K/V][layer][token]
    std::array<SpillableArray, 2> quantL2;             // [K/V][layer][token]
    std::vector<NonFiniteCell> nonFinite;
    std::vector<std::string> problems;  // what could not be analysed, and why
    // Where TP replicates KV: rank copies that differ from the one analysed (kv/replica_check.h).
    std::vector<ReplicaDifference> replicaDifferences;
    std::vector<Suspect> suspects;      // best first (analysis/suspect_search.h)
    // The state-space layers' recurrent states compared (analysis/state_analysis.h), in the
    // model's order; not kept in results files.
    std::vector<StateLayerAnalysis> states;
    // What the engine's KV does to the reference's output, as the bundle measured it
    // (format/impact_record.h; analysis/impact_summary.h sums it up); kept in results files.
    std::optional<ImpactRecord> impact;

    // Every array sized to the shape and NaN: in memory, or in temporary files in
    // `spillDirectory` when it is not empty.
    void allocate(const std::string& spillDirectory = {});
    // What allocate() takes for this shape, in bytes.
    std::size_t resultBytes() const;
    // Says the cells of `layer` are done with for now: a spilled prompt's pages of that layer go
    // back to their file (nothing happens in memory). Readers of many layers call it as they go.
    void releaseLayer(int layer) const;
    // Every cell of `layer` back to NaN, its non-finite cells, replica differences and cache scales forgotten (a layer
    // whose later window of tokens could not be read is not analysed at all).
    void clearLayer(int layer);
    int headsOf(int layer) const { return layerHeads.empty() ? heads : layerHeads[std::size_t(layer)]; }
    std::size_t cell(int layer, std::int64_t token, int head) const
    {
        return (std::size_t(layer) * std::size_t(tokens) + std::size_t(token)) * std::size_t(heads) + std::size_t(head);
    }
    float value(Metric m, int layer, std::int64_t token, int head) const
    {
        return metrics[std::size_t(m)][cell(layer, token, head)];
    }
    float bcValue(KvPart part, int layer, std::int64_t token) const
    {
        return bc[std::size_t(part)][std::size_t(layer) * std::size_t(tokens) + std::size_t(token)];
    }
    float bcVsNoiseValue(KvPart part, int layer, std::int64_t token) const
    {
        return bcVsNoise[std::size_t(part)][std::size_t(layer) * std::size_t(tokens) + std::size_t(token)];
    }
    bool hasQuantisedLayers() const { return !quantLinf[0].empty(); }
    // The quantisation floor of (layer, token) in L-inf or L2; NaN where the cache is not quantised.
    float quantFloor(KvPart part, MetricKind kind, int layer, std::int64_t token) const
    {
        if (!hasQuantisedLayers())
            return std::nanf("");
        const auto& a = kind == MetricKind::L2 ? quantL2 : quantLinf;
        return a[std::size_t(part)][std::size_t(layer) * std::size_t(tokens) + std::size_t(token)];
    }
};

struct AggregateBc {
    std::vector<std::string> promptIds;  // the three-way prompts pooled
    std::vector<std::string> layers;
    std::int64_t generationCount = 0;  // minimum over prompts of the decode positions
    std::array<std::vector<float>, 2> bc;        // [K/V][layer][generation index]
    std::vector<int> divergenceCounts;           // per generation index, over the pooled prompts
    std::array<std::vector<float>, 2> combined;  // [K/V][layer]: every prompt and token pooled
    // The same two for BC against the noise floor (metrics/bc_vs_noise.h).
    std::array<std::vector<float>, 2> bcVsNoise;
    std::array<std::vector<float>, 2> combinedVsNoise;
};

struct AnalysisResult {
    std::string bundle;  // its path; a sweep's label
    std::vector<SweepBundle> bundles;  // a sweep's bundles, those left out with why (empty for one bundle)
    std::vector<PromptAnalysis> prompts;
    std::optional<AggregateBc> aggregate;
    std::vector<std::string> problems;  // prompts that could not be analysed at all
    // Layers of groups kvscope does not compare (state-space layers of hybrid models), with what they are.
    std::vector<std::pair<std::string, std::string>> notCompared;
    std::vector<Suspect> suspects;      // the prompts' suspects pooled, best first
};

// Reductions over heads for one (layer, token). Absent (NaN) heads are skipped; all
// absent gives NaN and head -1.
struct HeadReduction {
    float value = std::nanf("");
    int head = -1;  // the head holding the max (or min, for cos)
};
HeadReduction maxOverHeads(const PromptAnalysis& p, Metric m, int layer, std::int64_t token);
HeadReduction minOverHeads(const PromptAnalysis& p, Metric m, int layer, std::int64_t token);
float meanOverHeads(const PromptAnalysis& p, Metric m, int layer, std::int64_t token);
// The three-way error ratio, defined once for every view. A cell's noise floor is its largest
// base (expected vs baseline, dtype-only) error over heads, and where the engine stores KV
// quantised at least what quantising expected the way the cache stores it costs (quantLinf:
// an fp8 cache is judged against fp8); a head's ratio is its actual error
// over that floor, actual / max(floor, 1e-10); the cell's ratio is its largest head ratio
// (= the reference tool's max-over-heads actual / max-over-heads base), with that head. NaN
// when either side has no data. The floor is pooled over heads because one head's own base
// error, a maximum over only head_dim values, is too noisy a denominator: on clean captures
// the max over heads of actual / own base sits at 1.4-2.3, against 1.0-1.3 with the floor.
float noiseFloor(const PromptAnalysis& p, Metric actual, int layer, std::int64_t token);
float headErrorRatio(const PromptAnalysis& p, Metric actual, int layer, std::int64_t token, int head);
HeadReduction errorRatio(const PromptAnalysis& p, Metric actual, int layer, std::int64_t token);
float meanErrorRatio(const PromptAnalysis& p, Metric actual, int layer, std::int64_t token);

// Per-layer summaries: the extreme value over tokens (and heads),
// with where it is.
struct Extreme {
    float value = std::nanf("");
    int layer = -1;
    std::int64_t token = -1;
    int head = -1;
};
Extreme layerMax(const PromptAnalysis& p, Metric m, int layer);
// The lowest per-token BC against the noise floor of a layer.
Extreme layerMinBcVsNoise(const PromptAnalysis& p, KvPart part, int layer);

// A token's BC compares two histograms of its num_heads x head_dim errors: with fewer values
// than ten a bin of the reference tool's 100, two draws of the same noise already differ, and
// the figure means little (a 2-head x 16-dim token has 32). The combined BC pools every token.
inline constexpr std::int64_t kMinValuesForTokenBc = 1000;
// The fewest values a token of `p` has in one part, over its layers.
inline std::int64_t smallestTokenValues(const PromptAnalysis& p)
{
    std::int64_t fewest = std::int64_t(p.heads) * std::min(p.dims.k, p.dims.v);
    for (std::size_t l = 0; l < p.layerDims.size(); ++l)
        fewest = std::min(fewest, std::int64_t(p.headsOf(int(l))) * std::min(p.layerDims[l].k, p.layerDims[l].v));
    return fewest;
}
inline bool tokenBcMeaningful(const PromptAnalysis& p)
{
    return smallestTokenValues(p) >= kMinValuesForTokenBc;
}
// The BC by generation index pools that token of every pooled prompt: the fewest values it
// pools (0 without an aggregate), and whether that is enough, as for a token's own BC.
std::int64_t smallestGenerationValues(const AnalysisResult& result);
inline bool generationBcMeaningful(const AnalysisResult& result)
{
    return smallestGenerationValues(result) >= kMinValuesForTokenBc;
}
// What `part` is called in prompt `p` ("k", "v", "c_kv", "k_pe"), and upper-cased for
// headings of attention layers ("K", "V"; MLA's names stay as they are).
inline const std::string& partName(const PromptAnalysis& p, KvPart part) { return p.partNames[std::size_t(part)]; }
std::string partTitle(const PromptAnalysis& p, KvPart part);
// A suspect's "k", "v" or "kv" in the words of `p` ("c_kv", "k_pe", "c_kv and k_pe" for MLA).
std::string partsNamed(const PromptAnalysis& p, const std::string& kv);

}  // namespace kvscope
