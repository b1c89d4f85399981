#include "analysis/layer_comparison.h"

#include "format/int4_rht.h"
#include "format/nvfp4.h"

#include "util/simd_clones.h"
#include "metrics/vector_metrics.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>

namespace kvscope {

float* errorScratch(std::size_t size, int which)
{
    thread_local std::vector<float> buffers[2];
    if (buffers[which].size() < size)
        buffers[which].resize(size);
    return buffers[which].data();
}

namespace {

// |reference - x| of one head's `n` values into `out`, widening [lo, hi] by them (NaN does not).
KVSCOPE_VECTOR_CLONES
void headErrors(const float* reference, const float* x, std::size_t n, float* out, float& lo, float& hi)
{
    float l = lo, h = hi;
#pragma omp simd reduction(min : l) reduction(max : h)
    for (std::size_t i = 0; i < n; ++i) {
        const float e = std::fabs(reference[i] - x[i]);  // float32, as the reference computes it
        out[i] = e;
        l = std::min(l, e);
        h = std::max(h, e);
    }
    lo = l;
    hi = h;
}

}  // namespace

ErrorRange rowErrors(const RowView& reference, const RowView& x, int heads, int headDim, float* out)
{
    float lo = std::numeric_limits<float>::infinity(), hi = -lo;
    for (int h = 0; h < heads; ++h)
        headErrors(reference.head(h), x.head(h), std::size_t(headDim), out + std::size_t(h) * std::size_t(headDim), lo, hi);
    ErrorRange range;
    if (lo <= hi)  // all NaN leaves the range empty
        range.lo = lo, range.hi = hi;
    return range;
}

void TokenErrorStats::reset(std::int64_t tokenCount, int rangeCount)
{
    tokens = tokenCount;
    kept = kept.clippedTo({0, tokenCount});
    const std::size_t keptCount = keepCounts ? std::size_t(std::max<std::int64_t>(0, kept.end - kept.begin)) : 0;
    for (int part = 0; part < 2; ++part) {
        ranges[std::size_t(part)].assign(std::size_t(tokenCount), ErrorRange{});
        counts[std::size_t(part)].assign(keptCount * 2 * kBcBins, 0);
        noise[std::size_t(part)].assign(keptCount * 2, NoiseSpan{});
    }
    noiseStores.resize(std::size_t(rangeCount));
    for (auto& store : noiseStores) {
        store.clear();
        // about what the touched spans of each thread's share of the tokens take
        store.reserve(keptCount * 4 * 192 / std::size_t(rangeCount));
    }
    noiseTotals.resize(std::size_t(rangeCount));
    for (auto& range : noiseTotals)
        for (auto& part : range)
            for (LogHistogram& h : part)
                h.clear();
}

bool comparable(const LayerRows& reference, const LayerRows& actual, const LayerRows* base, std::int64_t token)
{
    return reference.present(token) && actual.present(token) && (!base || base->present(token));
}

RowView quantiseRow(const RowView& expected, const LayerRows& actual, KvPart part, std::int64_t token)
{
    const int dim = actual.headDim(part);
    thread_local std::vector<float> row;
    row.resize(actual.rowSize(part));
    for (int h = 0; h < actual.heads(); ++h) {
        const std::optional<LayerSource::Storage> storage = actual.storedAs(part, token, h);
        if (!storage || !isQuantised(storage->dtype))
            return {};  // (a part the layer keeps unquantised, a v_dtype's other: its floor is its dtype's)
        const float* x = expected.head(h);
        float* q = row.data() + std::size_t(h) * std::size_t(dim);
        const RawTensor* tensor = storage->tensor;
        if (storage->dtype == DType::Int4TokenHead && tensor) {  // rotated, quantised with the row's scale and zero point
            if (std::int64_t(tensor->rhtSigns.size()) != dim)
                return {};
            int4RhtRequantise(x, dim, tensor->scaleAt(storage->first), tensor->zeroPointAt(storage->first),
                              tensor->rhtSigns.data(), q);
            continue;
        }
        if (storage->dtype == DType::Float4E2M1 && tensor) {  // each block of 16 with its scale, under the global one
            for (int i = 0; i < dim; i += kNvfp4Block)
                nvfp4Requantise(x + i, std::min(kNvfp4Block, dim - i), tensor->scaleAt(storage->first + i), tensor->scale,
                                q + i);
            continue;
        }
        for (int i = 0; i < dim; ++i)
            if (const float scale = storage->scaleOf(i); scale > 0.0f)
                q[i] = roundToDType(storage->dtype, x[i] / scale) * scale;
            else
                q[i] = 0.0f;
    }
    return {row.data(), std::size_t(dim)};
}

namespace {

// The cell's quantisation floor: `quantised` (expected as the cache stores it) against
// `reference`, max over heads.
void storeQuantisationFloor(const RowView& reference, const RowView& quantised, int heads, int dim, KvPart part,
                            std::int64_t token, int layer, PromptAnalysis& out)
{
    double linf = -1, l2 = -1;
    for (int h = 0; h < heads; ++h) {
        VectorComparison c;
        if (compareVectors(reference.head(h), quantised.head(h), dim, c)) {
            linf = std::max(linf, c.linf);
            l2 = std::max(l2, c.l2);
        }
    }
    if (linf < 0)
        return;
    const std::size_t at = std::size_t(layer) * std::size_t(out.tokens) + std::size_t(token);
    out.quantLinf[std::size_t(part)][at] = float(linf);
    out.quantL2[std::size_t(part)][at] = float(l2);
}

// "nan", "inf" or "-inf" for a vector holding one (NaN first), else null.
const char* nonFiniteIn(const float* x, int dim)
{
    const char* kind = nullptr;
    for (int d = 0; d < dim; ++d)
        if (std::isnan(x[d]))
            return "nan";
        else if (!kind && std::isinf(x[d]))
            kind = x[d] > 0 ? "inf" : "-inf";
    return kind;
}

// A comparison that failed: each side whose vector holds the NaN or infinity (`threeWay`: the
// reference is the baseline and `base` expected; two-way the reference is expected).
void listNonFinite(const float* reference, const float* actual, const float* base, int dim, NonFiniteCell cell,
                   bool threeWay, std::vector<NonFiniteCell>& out)
{
    const std::pair<const float*, const char*> sides[] = {
        {actual, "actual"}, {threeWay ? base : reference, "expected"}, {threeWay ? reference : nullptr, "baseline"}};
    const std::size_t before = out.size();
    for (const auto& [x, side] : sides)
        if (const char* kind = x ? nonFiniteIn(x, dim) : nullptr) {
            cell.side = side;
            cell.value = kind;
            out.push_back(cell);
        }
    if (out.size() == before) {  // no input holds one (the sums cannot overflow): say the comparison
        cell.side = "actual";
        out.push_back(cell);
    }
}

// Tokens [begin, end) of compareLayer: every write goes to cells and stats of these tokens
// only, and to the stats' stores of `member` (the team member running it).
void compareTokens(const LayerRows& reference, const LayerRows& actual, const LayerRows* base, int layer, PromptAnalysis& out,
                   std::vector<NonFiniteCell>& nonFinite, TokenErrorStats* stats, int member, std::int64_t begin,
                   std::int64_t end, const std::optional<BcNeeds>& bcs)
{
    std::uint64_t scratch[2][kBcBins];
    LayerRows::Tile tiles[3][2];  // [reference, actual, base][part]
    const bool quantised = out.hasQuantisedLayers() && isQuantised(out.layerDtypes[std::size_t(layer)]);
    for (std::int64_t t = begin; t < end; ++t) {
        if (!comparable(reference, actual, base, t))
            continue;
        for (KvPart part : {KvPart::K, KvPart::V}) {
            const std::size_t side = std::size_t(part);
            const int dim = reference.headDim(part);
            const std::size_t n = reference.rowSize(part);
            const RowView referenceRow = reference.row(part, t, tiles[0][side]);
            const RowView actualRow = actual.row(part, t, tiles[1][side]);
            const RowView baseRow = base ? base->row(part, t, tiles[2][side]) : RowView{};
            bool finite = true;  // every head of every side: else no BC (its errors would bin Inf/NaN)
            auto store = [&](std::size_t cell, const VectorComparison& c, bool ofBase) {
                auto metric = [&](MetricKind kind) {
                    const Metric m = metricFor(part, kind);
                    return std::size_t(ofBase ? baseOf(m) : m);
                };
                out.metrics[metric(MetricKind::Cos)][cell] = float(c.cos);
                out.metrics[metric(MetricKind::Linf)][cell] = float(c.linf);
                out.metrics[metric(MetricKind::L2)][cell] = float(c.l2);
            };
            for (int h = 0; h < reference.heads(); ++h) {
                const std::size_t cell = out.cell(layer, t, h);
                VectorComparison c, cb;
                const int ok = base ? compareVectorPair(referenceRow.head(h), actualRow.head(h), baseRow.head(h), dim, c, cb)
                                    : (compareVectors(referenceRow.head(h), actualRow.head(h), dim, c) ? 1 : 0);
                if (ok & 1)
                    store(cell, c, false);
                if (base && (ok & 2))
                    store(cell, cb, true);
                if (ok != (base ? 3 : 1))
                    listNonFinite(referenceRow.head(h), actualRow.head(h), base ? baseRow.head(h) : nullptr, dim,
                                  {layer, t, h, part, {}, {}}, base != nullptr, nonFinite);
                finite = finite && ok == (base ? 3 : 1);
            }
            // A quantised cache is judged against expected stored the same way (its floor).
            const RowView quantisedRow = quantised ? quantiseRow(base ? baseRow : referenceRow, actual, part, t) : RowView{};
            if (quantisedRow.data)
                storeQuantisationFloor(referenceRow, quantisedRow, reference.heads(), dim, part, t, layer, out);
            if (!base || !finite || !bcs)
                continue;  // the token's BC stays NaN, its range empty: aggregates leave it out
            // BC between |baseline - expected| (as a quantised cache stores it) and
            // |baseline - actual| over all heads.
            float* baseErrors = errorScratch(n, 0);
            float* actualErrors = errorScratch(n, 1);
            ErrorRange range = rowErrors(referenceRow, quantisedRow.data ? quantisedRow : baseRow, reference.heads(), dim, baseErrors);
            range.merge(rowErrors(referenceRow, actualRow, reference.heads(), dim, actualErrors));
            if (stats)
                stats->ranges[std::size_t(part)][std::size_t(t)] = range;
            const std::size_t at = std::size_t(layer) * std::size_t(out.tokens) + std::size_t(t);
            if (bcs->perToken) {
                const bool keepCounts = stats && stats->keeps(t);
                std::uint64_t* p = keepCounts ? stats->countsOf(part, t, 0) : scratch[0];
                std::uint64_t* q = keepCounts ? stats->countsOf(part, t, 1) : scratch[1];
                if (!keepCounts)
                    std::fill_n(&scratch[0][0], 2 * kBcBins, 0);
                const SharedBins bins(range);
                bins.add(baseErrors, n, p);
                bins.add(actualErrors, n, q);
                out.bc[std::size_t(part)][at] = float(bhattacharyya(p, q, kBcBins));
            }
            auto* totals = stats && stats->pooledHere(t) ? &stats->noiseTotals[std::size_t(member)][side] : nullptr;
            if (!bcs->perTokenVsNoise) {  // the totals only
                if (totals) {
                    (*totals)[0].add(baseErrors, n);
                    (*totals)[1].add(actualErrors, n);
                }
                continue;
            }
            thread_local LogHistogram noiseBase, noiseActual;
            noiseBase.add(baseErrors, n, totals ? &(*totals)[0] : nullptr);
            noiseActual.add(actualErrors, n, totals ? &(*totals)[1] : nullptr);
            out.bcVsNoise[std::size_t(part)][at] = float(bcVsNoise(noiseBase, noiseActual));
            if (stats && stats->keeps(t)) {
                std::vector<std::uint32_t>& store = stats->noiseStores[std::size_t(member)];
                int set = 0;
                for (const LogHistogram* h : {&noiseBase, &noiseActual}) {
                    TokenErrorStats::NoiseSpan& span = stats->noiseOf(part, t, set++);
                    if (h->last < 0)
                        continue;
                    span = {h->first, std::uint32_t(h->last - h->first + 1), std::uint32_t(member), store.size()};
                    store.insert(store.end(), h->counts.begin() + h->first, h->counts.begin() + h->last + 1);
                }
            }
            noiseBase.clear();
            noiseActual.clear();
        }
    }
}

}  // namespace

void compareLayer(const LayerRows& reference, const LayerRows& actual, const LayerRows* base, int layer,
                  PromptAnalysis& out, std::vector<NonFiniteCell>& nonFinite, TokenErrorStats* stats, WorkTeam* team,
                  std::optional<BcNeeds> bcs, PositionRange window)
{
    auto sameShape = [](const LayerRows& a, const LayerRows& b) {
        return a.heads() == b.heads() && a.seq() == b.seq() && a.dims() == b.dims();
    };
    if (!sameShape(reference, actual) || (base && !sameShape(reference, *base)))
        throw std::invalid_argument("compareLayer: reference, actual and base differ in shape");
    if (reference.heads() != out.headsOf(layer) || reference.seq() != out.tokens)
        throw std::invalid_argument("compareLayer: layer shape differs from the prompt's result");
    const std::int64_t tokens = reference.seq();
    const PositionRange range = window.clippedTo({0, tokens});
    if (stats && range.begin == 0)
        stats->reset(tokens, team ? team->size() : 1);
    // Chunks of tokens, each writing only its own cells; non-finite cells are collected per
    // chunk and appended in token order.
    const int chunks = range.empty() ? 0 : int((range.end - range.begin + kCompareChunk - 1) / kCompareChunk);
    std::vector<std::vector<NonFiniteCell>> found(static_cast<std::size_t>(chunks));
    auto compareChunk = [&](int chunk, int member) {
        const std::int64_t begin = range.begin + chunk * kCompareChunk, end = std::min(range.end, begin + kCompareChunk);
        compareTokens(reference, actual, base, layer, out, found[std::size_t(chunk)], stats, member, begin, end, bcs);
    };
    if (team)
        team->run(chunks, compareChunk);
    else
        for (int chunk = 0; chunk < chunks; ++chunk)
            compareChunk(chunk, 0);
    for (const auto& cells : found)
        nonFinite.insert(nonFinite.end(), cells.begin(), cells.end());
}

}  // namespace kvscope
