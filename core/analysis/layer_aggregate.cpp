#include "analysis/layer_aggregate.h"

#include <algorithm>
#include <array>
#include <cstdint>
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

void addChunks(std::vector<CountTask>& tasks, CountTask task)
{
    for (std::int64_t at = task.begin; at < task.end; at += kCountChunk) {
        CountTask chunk = task;
        chunk.begin = at;
        chunk.end = std::min(task.end, at + kCountChunk);
        tasks.push_back(chunk);
    }
}

}  // namespace

void aggregateLayer(const AnalysisResult& result, const std::vector<int>& pooled, const std::vector<LayerSides>& allSides,
                    const std::vector<TokenErrorStats>& allStats, int layer, AggregateBc& aggregate, WorkTeam* team)
{
    auto sides = [&](std::size_t i) -> const LayerSides& { return allSides[std::size_t(pooled[i])]; };
    auto stats = [&](std::size_t i) -> const TokenErrorStats& { return allStats[std::size_t(pooled[i])]; };
    const std::size_t gCount = std::size_t(aggregate.generationCount);
    auto promptLen = [&](std::size_t i) { return result.prompts[std::size_t(pooled[i])].promptLen; };
    // One prompt: each generation index is one token, whose counts and noise histograms are
    // those its own BCs came from; pooling them again would give the same bits.
    const bool onePrompt = pooled.size() == 1;

    std::array<PartPlan, 2> plans;
    std::vector<CountTask> tasks;
    for (KvPart part : {KvPart::K, KvPart::V}) {
        PartPlan& plan = plans[std::size_t(part)];
        // Pass 1: the shared ranges, from the per-token ranges. By generation index, and combined.
        plan.byIndex.assign(gCount, ErrorRange{});
        ErrorRange combined;
        for (std::size_t i = 0; i < pooled.size(); ++i) {
            if (!sides(i).ok)
                continue;
            for (std::int64_t t = 0; t < stats(i).tokens; ++t) {
                const ErrorRange& r = stats(i).range(part, t);
                combined.merge(r);
                const std::int64_t g = t - promptLen(i);
                if (g >= 0 && std::size_t(g) < gCount)
                    plan.byIndex[std::size_t(g)].merge(r);
            }
        }
        if (combined.empty())
            continue;
        plan.empty = false;
        plan.combinedBins.emplace(combined);
        plan.combined.resize(std::size_t(team ? team->size() : 1));
        if (onePrompt) {
            const PromptAnalysis& p = result.prompts[std::size_t(pooled[0])];
            for (std::size_t g = 0; g < gCount; ++g) {
                const std::int64_t t = p.promptLen + std::int64_t(g);
                aggregate.bc[std::size_t(part)][std::size_t(layer) * gCount + g] = p.bcValue(part, layer, t);
                aggregate.bcVsNoise[std::size_t(part)][std::size_t(layer) * gCount + g] = p.bcVsNoiseValue(part, layer, t);
            }
            if (sides(0).ok)
                addChunks(tasks, {part, false, 0, 0, sides(0).reference.seq});
            continue;
        }
        // A generation index whose every token has the pooled range itself has the same bins
        // as those tokens: their counts add up exactly.
        plan.reuse.assign(gCount, 1);
        for (std::size_t i = 0; i < pooled.size(); ++i)
            for (std::size_t g = 0; g < gCount && sides(i).ok; ++g) {
                const ErrorRange& r = stats(i).range(part, promptLen(i) + std::int64_t(g));
                if (!r.empty() && (r.lo != plan.byIndex[g].lo || r.hi != plan.byIndex[g].hi))
                    plan.reuse[g] = 0;
            }
        for (const ErrorRange& r : plan.byIndex)
            plan.indexBins.emplace_back(r);
        plan.indexBase.resize(gCount);
        plan.indexTarget.resize(gCount);
        for (std::size_t i = 0; i < pooled.size(); ++i) {
            if (!sides(i).ok)
                continue;
            // Each prompt's tokens outside the generation indices: combined bins only.
            const std::int64_t seq = sides(i).reference.seq;
            const std::int64_t prefillEnd = std::min(seq, promptLen(i));
            addChunks(tasks, {part, false, i, 0, prefillEnd});
            addChunks(tasks, {part, false, i, std::min(seq, prefillEnd + std::int64_t(gCount)), seq});
        }
        addChunks(tasks, {part, true, 0, 0, std::int64_t(gCount)});
    }

    // Pass 2: counts on the shared bins, every token's errors computed once.
    auto count = [&](int index, int member) {
        const CountTask& task = tasks[std::size_t(index)];
        PartPlan& plan = plans[std::size_t(task.part)];
        std::array<Histogram, 2>& combined = plan.combined[std::size_t(member)];
        // Token t of pooled prompt i, at generation index g (-1: none counted).
        auto countTokens = [&](std::size_t i, std::int64_t first, std::int64_t last, std::int64_t gOfFirst) {
            const LayerSides& s = sides(i);
            const TokenErrorStats& st = stats(i);
            const LayerRows reference(s.reference), actual(s.actual), base(s.base);
            const std::size_t n = reference.rowSize();
            float* const baseErrors = errorScratch(n, 0);
            float* const actualErrors = errorScratch(n, 1);
            LayerRows::Tile referenceTile, actualTile, baseTile;
            for (std::int64_t t = first; t < last; ++t) {
                if (st.range(task.part, t).empty())
                    continue;  // not held by every side
                const RowView r = reference.row(task.part, t, referenceTile);
                rowErrors(r, base.row(task.part, t, baseTile), reference.heads(), reference.headDim(), baseErrors);
                rowErrors(r, actual.row(task.part, t, actualTile), reference.heads(), reference.headDim(),
                          actualErrors);
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
        };
        if (!task.byIndex) {
            countTokens(task.prompt, task.begin, task.end, -1);
            return;
        }
        for (std::size_t i = 0; i < pooled.size(); ++i)
            if (sides(i).ok)
                countTokens(i, promptLen(i) + task.begin, promptLen(i) + task.end, task.begin);
    };
    if (team)
        team->run(int(tasks.size()), count);
    else
        for (int i = 0; i < int(tasks.size()); ++i)
            count(i, 0);

    for (KvPart part : {KvPart::K, KvPart::V}) {
        PartPlan& plan = plans[std::size_t(part)];
        if (plan.empty)
            continue;
        Histogram combinedBase, combinedTarget;
        for (const auto& [base, target] : plan.combined) {
            combinedBase.merge(base);
            combinedTarget.merge(target);
        }
        aggregate.combined[std::size_t(part)][std::size_t(layer)] = float(bhattacharyya(combinedBase, combinedTarget));
        for (std::size_t g = 0; g < gCount && !onePrompt; ++g)
            if (!plan.byIndex[g].empty())  // no prompt holds this index: no data, not BC 1
                aggregate.bc[std::size_t(part)][std::size_t(layer) * gCount + g] =
                    float(bhattacharyya(plan.indexBase[g], plan.indexTarget[g]));
        // BC against the noise floor: fixed bins, so the counts of every token simply add up
        // (the comparison summed them per thread).
        LogHistogram noiseBase, noiseActual;
        for (std::size_t i = 0; i < pooled.size(); ++i) {
            if (!sides(i).ok)
                continue;  // not compared at this layer: its stats are another layer's
            for (const auto& member : stats(i).noiseTotals) {
                noiseBase.merge(member[std::size_t(part)][0]);
                noiseActual.merge(member[std::size_t(part)][1]);
            }
        }
        aggregate.combinedVsNoise[std::size_t(part)][std::size_t(layer)] = float(bcVsNoise(noiseBase, noiseActual));
        // By generation index: the prompts' tokens at that index, one index at a time.
        LogHistogram indexNoiseBase, indexNoiseActual;
        for (std::size_t g = 0; g < gCount && !onePrompt; ++g) {
            for (std::size_t i = 0; i < pooled.size(); ++i) {
                const std::int64_t t = promptLen(i) + std::int64_t(g);
                const TokenErrorStats& st = stats(i);
                if (!sides(i).ok || st.range(part, t).empty())
                    continue;
                const auto* spans = &st.noise[std::size_t(part)][std::size_t(t) * 2];
                indexNoiseBase.merge(spans[0].first, st.noiseCounts(spans[0]), spans[0].size);
                indexNoiseActual.merge(spans[1].first, st.noiseCounts(spans[1]), spans[1].size);
            }
            aggregate.bcVsNoise[std::size_t(part)][std::size_t(layer) * gCount + g] =
                float(bcVsNoise(indexNoiseBase, indexNoiseActual));
            indexNoiseBase.clear();
            indexNoiseActual.clear();
        }
    }
}

}  // namespace kvscope
