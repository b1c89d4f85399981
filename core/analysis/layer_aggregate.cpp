#include "analysis/layer_aggregate.h"

#include <algorithm>
#include <array>
#include <cstdint>
#include <cmath>
#include <limits>
#include <optional>

namespace kvscope {

namespace {

// One part's shared bins, and the counts the second pass leaves on them.
struct PartPlan {
    bool empty = true;  // no token of any prompt has errors
    std::vector<ErrorRange> byIndex;
    std::optional<SharedBins> combinedBins;
    std::vector<char> reuse;  // per generation index: its tokens' own counts add up exactly
    std::vector<SharedBins> indexBins;
    std::vector<Histogram> indexBase, indexTarget;  // [generation index]
    std::vector<std::array<Histogram, 2>> combined;  // [team member][base, actual]
};

// Second-pass work: tokens [begin, end) of one prompt (combined bins only), or generation
// indices [begin, end) of every prompt (both bins; a generation index is counted by one task).
struct CountTask {
    KvPart part = KvPart::K;
    bool byIndex = false;
    std::size_t prompt = 0;  // of `pooled`, when not byIndex
    std::int64_t begin = 0;
    std::int64_t end = 0;
};

constexpr std::int64_t kCountChunk = 64;

// Ranges combined over every process: lows by their minimum, highs by their maximum.
void shareRanges(AnalysisShare& share, std::vector<ErrorRange*> ranges)
{
    std::vector<double> lows, highs;
    for (const ErrorRange* r : ranges) {
        lows.push_back(r->lo);
        highs.push_back(r->hi);
    }
    share.minimum(lows);
    share.maximum(highs);
    for (std::size_t i = 0; i < ranges.size(); ++i)
        *ranges[i] = {lows[i], highs[i]};
}

void shareCounts(AnalysisShare& share, std::vector<Histogram*> histograms)
{
    std::vector<std::uint64_t> counts;
    for (const Histogram* h : histograms)
        counts.insert(counts.end(), h->counts.begin(), h->counts.end());
    share.sum(counts);
    auto at = counts.begin();
    for (Histogram* h : histograms) {
        std::copy(at, at + std::ptrdiff_t(h->counts.size()), h->counts.begin());
        at += std::ptrdiff_t(h->counts.size());
    }
}

// Log histograms combined over every process: their touched bins first, then the counts in them.
void shareLogCounts(AnalysisShare& share, std::vector<LogHistogram*> histograms)
{
    std::vector<ErrorRange> touched;  // [first, last] bins, as a range of bin numbers
    for (const LogHistogram* h : histograms)
        touched.push_back({double(h->first), double(h->last)});
    std::vector<ErrorRange*> ranges;
    for (ErrorRange& r : touched)
        ranges.push_back(&r);
    shareRanges(share, ranges);
    std::vector<std::uint32_t> counts;
    for (std::size_t i = 0; i < histograms.size(); ++i)
        for (int b = int(touched[i].lo); b <= int(touched[i].hi); ++b)
            counts.push_back(histograms[i]->counts.empty() ? 0 : histograms[i]->counts[std::size_t(b)]);
    share.sum(counts);
    auto at = counts.begin();
    for (std::size_t i = 0; i < histograms.size(); ++i) {
        LogHistogram& h = *histograms[i];
        h.clear();
        const std::size_t size = std::size_t(std::max(0, int(touched[i].hi) - int(touched[i].lo) + 1));
        if (size > 0)
            h.merge(int(touched[i].lo), &*at, size);
        at += std::ptrdiff_t(size);
    }
}

// Values one process holds (the others NaN), on every process.
void shareOwnedValues(AnalysisShare& share, float* values, std::size_t count)
{
    std::vector<double> v(values, values + count);
    for (double& x : v)
        x = std::isnan(x) ? -std::numeric_limits<double>::infinity() : x;
    share.maximum(v);
    for (std::size_t i = 0; i < count; ++i)
        values[i] = std::isinf(v[i]) && v[i] < 0 ? std::nanf("") : float(v[i]);
}

void addChunks(std::vector<CountTask>& tasks, CountTask task)
{
    for (std::int64_t at = task.begin; at < task.end; at += kCountChunk) {
        CountTask chunk = task;
        chunk.begin = at;
        chunk.end = std::min(task.end, at + kCountChunk);
        tasks.push_back(chunk);
    }
}

// One layer of the pooled prompts into the aggregate, in steps: the shared bins of each part
// (pass 1, from the per-token ranges), every token's errors counted on them (pass 2, shared
// by the team), then the BCs on those bins and against the noise floor.
class LayerPooling {
public:
    LayerPooling(const AnalysisResult& result, const std::vector<int>& pooled, std::vector<char> compared,
                 const std::vector<TokenErrorStats>& allStats, int layer, AggregateBc& aggregate, WorkTeam* team,
                 AnalysisShare* share, BcNeeds needs)
        : m_result(result)
        , m_pooled(pooled)
        , m_compared(std::move(compared))
        , m_allStats(allStats)
        , m_layer(layer)
        , m_aggregate(aggregate)
        , m_team(team)
        , m_share(share)
        , m_needs(needs)
        , m_gCount(std::size_t(aggregate.generationCount))
        // One prompt: each generation index is one token, whose counts and noise histograms
        // are those its own BCs came from; pooling them again would give the same bits.
        , m_onePrompt(pooled.size() == 1)
    {
    }

    // Pass 1: the shared ranges of `part`, from the per-token ranges (by generation index,
    // and combined), and the second pass's tasks.
    void plan(KvPart part);
    // Pass 2: counts on the shared bins, every token's errors computed once; a window of
    // tokens at a time, from that window's sides.
    void count(const std::vector<LayerSides>& allSides, PositionRange window);
    bool hasTasks() const { return !m_tasks.empty(); }
    // The reference tool's BC on the shared bins, combined and by generation index.
    void writeSharedBinBc(KvPart part);
    // BC against the noise floor: fixed bins, so the counts of every token simply add up (the
    // comparison summed them per thread).
    void writeNoiseBc(KvPart part);
    // One pooled prompt: its own BCs by generation index, from the process that analysed it.
    void shareOnePromptBc(KvPart part);
    AnalysisShare* share() const { return m_share; }

private:
    const LayerSides& sides(std::size_t i) const { return (*m_allSides)[std::size_t(m_pooled[i])]; }
    bool compared(std::size_t i) const { return m_compared[std::size_t(m_pooled[i])] != 0; }
    std::int64_t tokens(std::size_t i) const { return m_result.prompts[std::size_t(m_pooled[i])].tokens; }
    const TokenErrorStats& stats(std::size_t i) const { return m_allStats[std::size_t(m_pooled[i])]; }
    // Whether pooled prompt i counts token t: not where an earlier pooled prompt holds the same
    // block (prefix caching: one KV, counted once).
    bool counts(std::size_t i, std::int64_t t) const { return stats(i).pooledHere(t); }
    std::int64_t promptLen(std::size_t i) const { return m_result.prompts[std::size_t(m_pooled[i])].promptLen; }
    std::size_t at(std::size_t g) const { return std::size_t(m_layer) * m_gCount + g; }
    void countTask(int index, int member);
    // Tokens [first, last) of pooled prompt i, the first at generation index gOfFirst (-1: none counted).
    void countTokens(const CountTask& task, std::array<Histogram, 2>& combined, std::size_t i, std::int64_t first,
                     std::int64_t last, std::int64_t gOfFirst);

    const AnalysisResult& m_result;
    const std::vector<int>& m_pooled;
    const std::vector<char> m_compared;           // [prompt]
    const std::vector<LayerSides>* m_allSides = nullptr;  // the window count() is counting
    PositionRange m_window;
    const std::vector<TokenErrorStats>& m_allStats;
    const int m_layer;
    AggregateBc& m_aggregate;
    WorkTeam* const m_team;
    AnalysisShare* const m_share;
    const BcNeeds m_needs;
    const std::size_t m_gCount;
    const bool m_onePrompt;
    std::array<PartPlan, 2> m_plans;
    std::vector<CountTask> m_tasks;
};

void LayerPooling::plan(KvPart part)
{
    PartPlan& plan = m_plans[std::size_t(part)];
    plan.byIndex.assign(m_gCount, ErrorRange{});
    ErrorRange combined;
    for (std::size_t i = 0; i < m_pooled.size(); ++i) {
        if (!compared(i))
            continue;
        for (std::int64_t t = 0; t < stats(i).tokens; ++t) {
            if (!counts(i, t))
                continue;
            const ErrorRange& r = stats(i).range(part, t);
            combined.merge(r);
            const std::int64_t g = t - promptLen(i);
            if (g >= 0 && std::size_t(g) < m_gCount)
                plan.byIndex[std::size_t(g)].merge(r);
        }
    }
    if (m_share) {
        std::vector<ErrorRange*> ranges{&combined};
        for (ErrorRange& r : plan.byIndex)
            ranges.push_back(&r);
        shareRanges(*m_share, ranges);
    }
    if (combined.empty())
        return;
    plan.empty = false;
    if (m_onePrompt) {  // (values left out are NaN, as copied)
        const PromptAnalysis& p = m_result.prompts[std::size_t(m_pooled[0])];
        for (std::size_t g = 0; g < m_gCount && compared(0); ++g) {  // (not compared: NaN, as left)
            const std::int64_t t = p.promptLen + std::int64_t(g);
            m_aggregate.bc[std::size_t(part)][at(g)] = p.bcValue(part, m_layer, t);
            m_aggregate.bcVsNoise[std::size_t(part)][at(g)] = p.bcVsNoiseValue(part, m_layer, t);
        }
    }
    if (!m_needs.countsPooled())
        return;
    plan.combinedBins.emplace(combined);
    plan.combined.resize(std::size_t(m_team ? m_team->size() : 1));
    if (m_onePrompt || !m_needs.perToken) {  // the combined bins only
        for (std::size_t i = 0; i < m_pooled.size(); ++i)
            if (compared(i))
                addChunks(m_tasks, {part, false, i, 0, tokens(i)});
        return;
    }
    // A generation index whose every token has the pooled range itself has the same bins as
    // those tokens: their counts add up exactly.
    plan.reuse.assign(m_gCount, 1);
    for (std::size_t i = 0; i < m_pooled.size(); ++i)
        for (std::size_t g = 0; g < m_gCount && compared(i); ++g) {
            const ErrorRange& r = stats(i).range(part, promptLen(i) + std::int64_t(g));
            if (!r.empty() && counts(i, promptLen(i) + std::int64_t(g)) &&
                (r.lo != plan.byIndex[g].lo || r.hi != plan.byIndex[g].hi))
                plan.reuse[g] = 0;
        }
    for (const ErrorRange& r : plan.byIndex)
        plan.indexBins.emplace_back(r);
    plan.indexBase.resize(m_gCount);
    plan.indexTarget.resize(m_gCount);
    for (std::size_t i = 0; i < m_pooled.size(); ++i) {
        if (!compared(i))
            continue;
        // Each prompt's tokens outside the generation indices: combined bins only.
        const std::int64_t seq = tokens(i);
        const std::int64_t prefillEnd = std::min(seq, promptLen(i));
        addChunks(m_tasks, {part, false, i, 0, prefillEnd});
        addChunks(m_tasks, {part, false, i, std::min(seq, prefillEnd + std::int64_t(m_gCount)), seq});
    }
    addChunks(m_tasks, {part, true, 0, 0, std::int64_t(m_gCount)});
}

void LayerPooling::countTokens(const CountTask& task, std::array<Histogram, 2>& combined, std::size_t i,
                               std::int64_t first, std::int64_t last, std::int64_t gOfFirst)
{
    PartPlan& plan = m_plans[std::size_t(task.part)];
    const LayerSides& s = sides(i);
    const TokenErrorStats& st = stats(i);
    const LayerRows reference(s.reference), actual(s.actual), base(s.base);
    const std::size_t n = reference.rowSize(task.part);
    float* const baseErrors = errorScratch(n, 0);
    float* const actualErrors = errorScratch(n, 1);
    LayerRows::Tile referenceTile, actualTile, baseTile;
    const PromptAnalysis& p = m_result.prompts[std::size_t(m_pooled[i])];
    const bool quantised = p.hasQuantisedLayers() && isQuantised(p.layerDtypes[std::size_t(m_layer)]);
    for (std::int64_t t = std::max(first, m_window.begin); t < std::min(last, m_window.end); ++t) {
        if (st.range(task.part, t).empty() || !counts(i, t))
            continue;  // not held by every side, or pooled with another prompt
        const RowView r = reference.row(task.part, t, referenceTile);
        RowView expected = base.row(task.part, t, baseTile);
        if (const RowView stored = quantised ? quantiseRow(expected, actual, task.part, t) : RowView{}; stored.data)
            expected = stored;  // as the comparison binned it
        rowErrors(r, expected, reference.heads(), reference.headDim(task.part), baseErrors);
        rowErrors(r, actual.row(task.part, t, actualTile), reference.heads(), reference.headDim(task.part), actualErrors);
        plan.combinedBins->add(baseErrors, n, combined[0]);
        plan.combinedBins->add(actualErrors, n, combined[1]);
        if (gOfFirst < 0)
            continue;
        const std::size_t g = std::size_t(gOfFirst + (t - first));
        if (plan.reuse[g]) {
            for (int b = 0; b < kBcBins; ++b) {
                plan.indexBase[g].counts[std::size_t(b)] += st.countsOf(task.part, t, 0)[b];
                plan.indexTarget[g].counts[std::size_t(b)] += st.countsOf(task.part, t, 1)[b];
            }
        } else {
            plan.indexBins[g].add(baseErrors, n, plan.indexBase[g]);
            plan.indexBins[g].add(actualErrors, n, plan.indexTarget[g]);
        }
    }
}

void LayerPooling::countTask(int index, int member)
{
    const CountTask& task = m_tasks[std::size_t(index)];
    std::array<Histogram, 2>& combined = m_plans[std::size_t(task.part)].combined[std::size_t(member)];
    if (!task.byIndex) {
        if (sides(task.prompt).ok)  // (a batch of prompts at a time: this one's sides are here)
            countTokens(task, combined, task.prompt, task.begin, task.end, -1);
        return;
    }
    for (std::size_t i = 0; i < m_pooled.size(); ++i)
        if (compared(i) && sides(i).ok)
            countTokens(task, combined, i, promptLen(i) + task.begin, promptLen(i) + task.end, task.begin);
}

void LayerPooling::count(const std::vector<LayerSides>& allSides, PositionRange window)
{
    m_allSides = &allSides;
    m_window = window;
    if (m_team)
        m_team->run(int(m_tasks.size()), [this](int index, int member) { countTask(index, member); });
    else
        for (int i = 0; i < int(m_tasks.size()); ++i)
            countTask(i, 0);
}

void LayerPooling::writeSharedBinBc(KvPart part)
{
    PartPlan& plan = m_plans[std::size_t(part)];
    if (plan.empty || !m_needs.countsPooled())
        return;
    const bool byIndex = !m_onePrompt && m_needs.perToken;
    Histogram combinedBase, combinedTarget;
    for (const auto& [base, target] : plan.combined) {
        combinedBase.merge(base);
        combinedTarget.merge(target);
    }
    if (m_share) {
        std::vector<Histogram*> histograms{&combinedBase, &combinedTarget};
        for (std::size_t g = 0; g < m_gCount && byIndex; ++g) {
            histograms.push_back(&m_plans[std::size_t(part)].indexBase[g]);
            histograms.push_back(&m_plans[std::size_t(part)].indexTarget[g]);
        }
        shareCounts(*m_share, histograms);
    }
    m_aggregate.combined[std::size_t(part)][std::size_t(m_layer)] = float(bhattacharyya(combinedBase, combinedTarget));
    for (std::size_t g = 0; g < m_gCount && byIndex; ++g)
        if (!plan.byIndex[g].empty())  // no prompt holds this index: no data, not BC 1
            m_aggregate.bc[std::size_t(part)][at(g)] = float(bhattacharyya(plan.indexBase[g], plan.indexTarget[g]));
}

void LayerPooling::writeNoiseBc(KvPart part)
{
    if (m_plans[std::size_t(part)].empty)
        return;
    LogHistogram noiseBase, noiseActual;
    for (std::size_t i = 0; i < m_pooled.size(); ++i) {
        if (!compared(i))
            continue;  // not compared at this layer: its stats are another layer's
        for (const auto& member : stats(i).noiseTotals) {
            noiseBase.merge(member[std::size_t(part)][0]);
            noiseActual.merge(member[std::size_t(part)][1]);
        }
    }
    if (m_share)
        shareLogCounts(*m_share, {&noiseBase, &noiseActual});
    m_aggregate.combinedVsNoise[std::size_t(part)][std::size_t(m_layer)] = float(bcVsNoise(noiseBase, noiseActual));
    if (m_onePrompt || !m_needs.perTokenVsNoise)  // (the tokens' own histograms were not kept)
        return;
    // By generation index: the prompts' tokens at that index, one index at a time (a chunk of
    // indices at a time when they are combined with other processes').
    constexpr std::size_t kSharedChunk = 1024;
    std::vector<LogHistogram> indexNoise(m_share ? 2 * std::min(kSharedChunk, m_gCount) : 2);
    const auto shareChunk = [&](std::size_t end) {  // indices [end - its size, end)
        std::vector<LogHistogram*> histograms;
        const std::size_t first = (end - 1) / kSharedChunk * kSharedChunk;
        for (std::size_t i = 0; i < 2 * (end - first); ++i)
            histograms.push_back(&indexNoise[i]);
        shareLogCounts(*m_share, histograms);
        for (std::size_t g = first; g < end; ++g)
            m_aggregate.bcVsNoise[std::size_t(part)][at(g)] =
                float(bcVsNoise(indexNoise[2 * (g - first)], indexNoise[2 * (g - first) + 1]));
        for (LogHistogram& h : indexNoise)
            h.clear();
    };
    for (std::size_t g = 0; g < m_gCount; ++g) {
        LogHistogram& indexNoiseBase = indexNoise[m_share ? 2 * (g % kSharedChunk) : 0];
        LogHistogram& indexNoiseActual = indexNoise[m_share ? 2 * (g % kSharedChunk) + 1 : 1];
        for (std::size_t i = 0; i < m_pooled.size(); ++i) {
            const std::int64_t t = promptLen(i) + std::int64_t(g);
            const TokenErrorStats& st = stats(i);
            if (!compared(i) || st.range(part, t).empty() || !counts(i, t))
                continue;
            const TokenErrorStats::NoiseSpan& base = st.noiseOf(part, t, 0);
            const TokenErrorStats::NoiseSpan& actual = st.noiseOf(part, t, 1);
            indexNoiseBase.merge(base.first, st.noiseCounts(base), base.size);
            indexNoiseActual.merge(actual.first, st.noiseCounts(actual), actual.size);
        }
        if (m_share) {
            if ((g + 1) % kSharedChunk == 0 || g + 1 == m_gCount)
                shareChunk(g + 1);
            continue;
        }
        m_aggregate.bcVsNoise[std::size_t(part)][at(g)] = float(bcVsNoise(indexNoiseBase, indexNoiseActual));
        indexNoiseBase.clear();
        indexNoiseActual.clear();
    }
}

void LayerPooling::shareOnePromptBc(KvPart part)
{
    if (!m_share || !m_onePrompt || m_plans[std::size_t(part)].empty)
        return;
    for (auto* values : {&m_aggregate.bc[std::size_t(part)], &m_aggregate.bcVsNoise[std::size_t(part)]})
        shareOwnedValues(*m_share, values->data() + at(0), m_gCount);
}

}  // namespace

void aggregateLayer(const AnalysisResult& result, const std::vector<int>& pooled, const std::vector<LayerSides>& allSides,
                    const std::vector<TokenErrorStats>& allStats, int layer, AggregateBc& aggregate, WorkTeam* team,
                    AnalysisShare* share, BcNeeds needs)
{
    std::vector<char> compared;
    for (const LayerSides& sides : allSides)
        compared.push_back(sides.ok ? 1 : 0);
    WindowedLayerPooling pooling(result, pooled, std::move(compared), allStats, layer, aggregate, team, share, needs);
    if (pooling.needsSides())
        pooling.count(allSides, PositionRange::all());
    pooling.finish();
}

class WindowedLayerPooling::Steps : public LayerPooling {
public:
    using LayerPooling::LayerPooling;
};

WindowedLayerPooling::WindowedLayerPooling(const AnalysisResult& result, const std::vector<int>& pooled,
                                           std::vector<char> compared, const std::vector<TokenErrorStats>& allStats,
                                           int layer, AggregateBc& aggregate, WorkTeam* team, AnalysisShare* share,
                                           BcNeeds needs)
    : m_pooling(std::make_unique<Steps>(result, pooled, std::move(compared), allStats, layer, aggregate, team, share, needs))

{
    for (KvPart part : {KvPart::K, KvPart::V})
        m_pooling->plan(part);
}

WindowedLayerPooling::~WindowedLayerPooling() = default;

bool WindowedLayerPooling::needsSides() const
{
    return m_pooling->hasTasks();
}

void WindowedLayerPooling::count(const std::vector<LayerSides>& allSides, PositionRange window)
{
    m_pooling->count(allSides, window);
}

bool WindowedLayerPooling::finish(bool unreadable)
{
    if (AnalysisShare* share = m_pooling->share()) {  // every process writes the layer's, or none
        std::vector<double> any{unreadable ? 1.0 : 0.0};
        share->maximum(any);
        unreadable = any[0] > 0;
    }
    if (unreadable)
        return false;
    for (KvPart part : {KvPart::K, KvPart::V}) {
        m_pooling->writeSharedBinBc(part);
        m_pooling->writeNoiseBc(part);
        m_pooling->shareOnePromptBc(part);
    }
    return true;
}

}  // namespace kvscope
