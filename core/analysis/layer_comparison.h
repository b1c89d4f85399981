#pragma once
// Compares one layer of one prompt: every (token, head) metric for K and V, and the
// per-token Bhattacharyya coefficients between the base and actual error sets (the reference
// tool's, and against the noise floor).
//
// Two-way: reference = expected, actual = the engine, no base.
// Three-way: reference = baseline, actual = the engine, base = expected.
// A token is compared only where every side holds it; elsewhere its cells stay NaN.

#include "analysis/analysis_result.h"
#include "analysis/bc_needs.h"
#include "kv/position_range.h"
#include "analysis/layer_rows.h"
#include "metrics/bc_vs_noise.h"
#include "metrics/bhattacharyya.h"
#include "kv/layer_kv.h"
#include "util/work_team.h"

#include <array>
#include <optional>
#include <vector>

namespace kvscope {

// Per token and part, what cross-prompt aggregation needs without keeping the errors: the
// range of both error sets together (empty where absent), which chooses the shared bin
// edges, and each set's counts on that range's own bins (reusable wherever a pooled range
// turns out to be the same range).
struct TokenErrorStats {
    std::int64_t tokens = 0;
    std::array<std::vector<ErrorRange>, 2> ranges;     // [part][token]
    std::array<std::vector<std::uint64_t>, 2> counts;  // [part][token - kept.begin][base, actual][bin]
    // Whether `counts` and `noise` are kept: only pooling several prompts by generation index
    // reads them (with one prompt, each generation index is one token, whose BCs the
    // comparison itself gives), and only of the tokens at generation indices: `kept` (a
    // sweep's hundreds of prompts would otherwise keep 3 kB of counts per token).
    bool keepCounts = true;
    PositionRange kept = PositionRange::all();
    bool keeps(std::int64_t token) const { return keepCounts && kept.contains(token); }
    // The sum of every token's bc_vs_noise histograms, per token range (the tokens one
    // thread compared): [range][part][base, actual].
    std::vector<std::array<std::array<LogHistogram, 2>, 2>> noiseTotals;
    // bc_vs_noise's bins of each token's base and actual errors, only the span they touch,
    // kept in one flat store per token range.
    struct NoiseSpan {
        int first = 0;
        std::uint32_t size = 0;
        std::uint32_t store = 0;
        std::size_t offset = 0;
    };
    std::array<std::vector<NoiseSpan>, 2> noise;  // [part][token - kept.begin][base, actual]
    std::vector<std::vector<std::uint32_t>> noiseStores;
    // [token]: 1 where an earlier pooled prompt holds the same block (prefix caching, see
    // kv/block_sharing.h): the pooled statistics leave the token out, having counted it there.
    // Set by the caller; empty: every token is pooled.
    std::vector<std::uint8_t> pooledElsewhere;
    bool pooledHere(std::int64_t token) const
    {
        return std::size_t(token) >= pooledElsewhere.size() || !pooledElsewhere[std::size_t(token)];
    }

    // For `tokenCount` tokens compared by `ranges` threads; keeps the buffers' memory.
    void reset(std::int64_t tokenCount, int ranges);
    const std::uint32_t* noiseCounts(const NoiseSpan& span) const
    {
        return noiseStores[span.store].data() + span.offset;
    }
    const ErrorRange& range(KvPart part, std::int64_t token) const { return ranges[std::size_t(part)][std::size_t(token)]; }
    // Of a token it keeps (keeps(token)).
    std::uint64_t* countsOf(KvPart part, std::int64_t token, int set)
    {
        return counts[std::size_t(part)].data() + (std::size_t(token - kept.begin) * 2 + std::size_t(set)) * kBcBins;
    }
    const std::uint64_t* countsOf(KvPart part, std::int64_t token, int set) const
    {
        return counts[std::size_t(part)].data() + (std::size_t(token - kept.begin) * 2 + std::size_t(set)) * kBcBins;
    }
    NoiseSpan& noiseOf(KvPart part, std::int64_t token, int set)
    {
        return noise[std::size_t(part)][std::size_t(token - kept.begin) * 2 + std::size_t(set)];
    }
    const NoiseSpan& noiseOf(KvPart part, std::int64_t token, int set) const
    {
        return noise[std::size_t(part)][std::size_t(token - kept.begin) * 2 + std::size_t(set)];
    }
};

// Writes layer `layer` of `out` (which must be allocated with matching tokens and heads);
// only that layer's cells are touched, so layers may be compared concurrently. Cells whose
// input holds NaN or infinity stay NaN and are listed in `nonFinite`, in token order; such a
// token has no BC for that part (NaN), and aggregates leave it out.
// With a `team`, its threads compare chunks of kCompareChunk tokens. Without `bcs` (kvscope
// diff needs only the metrics) the BCs stay NaN, and so do those `bcs` leaves out (with
// `stats`, the errors' ranges and the noise floor's totals are gathered whenever `bcs` is
// given: the pooled BCs come from them). With a `window`, only its tokens are
// compared (a long context, a window at a time, in order: `stats` start afresh with the
// window at token 0 and gather the later ones).
// Throws std::invalid_argument when the shapes of the sides differ.
inline constexpr std::int64_t kCompareChunk = 64;
void compareLayer(const LayerRows& reference, const LayerRows& actual, const LayerRows* base, int layer,
                  PromptAnalysis& out, std::vector<NonFiniteCell>& nonFinite, TokenErrorStats* stats = nullptr,
                  WorkTeam* team = nullptr, std::optional<BcNeeds> bcs = BcNeeds{},
                  PositionRange window = PositionRange::all());
inline void compareLayer(const LayerKv& reference, const LayerKv& actual, const LayerKv* base, int layer,
                         PromptAnalysis& out, std::vector<NonFiniteCell>& nonFinite, TokenErrorStats* stats = nullptr,
                         WorkTeam* team = nullptr)
{
    const std::optional<LayerRows> baseRows = base ? std::optional<LayerRows>(*base) : std::nullopt;
    compareLayer(reference, actual, baseRows ? &*baseRows : nullptr, layer, out, nonFinite, stats, team);
}

// Whether every side holds `token`.
bool comparable(const LayerRows& reference, const LayerRows& actual, const LayerRows* base, std::int64_t token);

// |reference - x| of every head into `out` (heads * headDim floats, head-major; float32, as
// the reference tool computes them); returns their range (empty if all are NaN).
ErrorRange rowErrors(const RowView& reference, const RowView& x, int heads, int headDim, float* out);
// Room for one token's errors (`size` floats), per thread: `which` 0 (base) or 1 (actual).
float* errorScratch(std::size_t size, int which);
// `expected` stored the way the engine stored this token (its format, the scale of each head),
// into a per-thread row; null data when `actual` does not say how it is stored. A quantised
// cache's BCs compare |baseline - expected as stored| with |baseline - actual|, in the
// comparison and in the pooled BCs' second pass alike.
RowView quantiseRow(const RowView& expected, const LayerRows& actual, KvPart part, std::int64_t token);

}  // namespace kvscope
