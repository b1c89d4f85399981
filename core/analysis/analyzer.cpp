#include "analysis/analyzer.h"

#include "analysis/suspects.h"

#include "format/bundle_error.h"
#include "util/buffer_allocator.h"
#include "kv/capture_loader.h"
#include "analysis/divergence.h"
#include "analysis/layer_comparison.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <exception>
#include <limits>
#include <mutex>
#include <optional>
#include <thread>
#include <tuple>

namespace kvscope {

namespace {

// One prompt's three sides of one layer, kept while the layer's aggregate is computed.
struct LayerSides {
    LayerSource reference;  // the references are decoded a few tokens at a time
    LayerKv actual;
    LayerSource base;
    bool ok = false;
};

// `allSides` and `allStats` (what comparing them left) are indexed by prompt; `pooled` lists
// the prompts pooled.
void aggregateLayer(const AnalysisResult& result, const std::vector<int>& pooled, const std::vector<LayerSides>& allSides,
                    const std::vector<TokenErrorStats>& allStats, int layer, AggregateBc& aggregate)
{
    auto sides = [&](std::size_t i) -> const LayerSides& { return allSides[std::size_t(pooled[i])]; };
    auto stats = [&](std::size_t i) -> const TokenErrorStats& { return allStats[std::size_t(pooled[i])]; };
    const std::size_t gCount = std::size_t(aggregate.generationCount);
    auto promptLen = [&](std::size_t i) { return result.prompts[std::size_t(pooled[i])].promptLen; };
    for (KvPart part : {KvPart::K, KvPart::V}) {
        // Pass 1: the shared ranges, from the per-token ranges. By generation index (the same
        // offset after each prompt's prefill), and combined (every prompt and token).
        std::vector<ErrorRange> byIndex(gCount);
        ErrorRange combined;
        for (std::size_t i = 0; i < pooled.size(); ++i) {
            if (!sides(i).ok)
                continue;
            for (std::int64_t t = 0; t < stats(i).tokens; ++t) {
                const ErrorRange& r = stats(i).range(part, t);
                combined.merge(r);
                const std::int64_t g = t - promptLen(i);
                if (g >= 0 && std::size_t(g) < gCount)
                    byIndex[std::size_t(g)].merge(r);
            }
        }
        if (combined.empty())
            continue;
        // One prompt: each generation index is one token, whose counts and noise histograms
        // are those its own BCs came from; pooling them again would give the same bits.
        const bool onePrompt = pooled.size() == 1;
        if (onePrompt) {
            const PromptAnalysis& p = result.prompts[std::size_t(pooled[0])];
            for (std::size_t g = 0; g < gCount; ++g) {
                const std::int64_t t = p.promptLen + std::int64_t(g);
                aggregate.bc[std::size_t(part)][std::size_t(layer) * gCount + g] = p.bcValue(part, layer, t);
                aggregate.bcVsNoise[std::size_t(part)][std::size_t(layer) * gCount + g] = p.bcVsNoiseValue(part, layer, t);
            }
        }
        // A generation index whose every token has the pooled range itself (always so with
        // one prompt) has the same bins as those tokens: their counts add up exactly.
        std::vector<char> reuse(gCount, 1);
        for (std::size_t i = 0; i < pooled.size() && !onePrompt; ++i)
            for (std::size_t g = 0; g < gCount && sides(i).ok; ++g) {
                const ErrorRange& r = stats(i).range(part, promptLen(i) + std::int64_t(g));
                if (!r.empty() && (r.lo != byIndex[g].lo || r.hi != byIndex[g].hi))
                    reuse[g] = 0;
            }
        // Pass 2: counts on the shared bins, every token's errors computed once.
        std::vector<SharedBins> indexBins;
        std::vector<Histogram> indexBase, indexTarget;
        if (!onePrompt) {
            for (const ErrorRange& r : byIndex)
                indexBins.emplace_back(r);
            indexBase.resize(gCount);
            indexTarget.resize(gCount);
        }
        const SharedBins combinedBins(combined);
        Histogram combinedBase, combinedTarget;
        // BC against the noise floor: fixed bins, so the counts of every token simply add up
        // (the comparison summed them per token range).
        LogHistogram noiseBase, noiseActual;
        for (std::size_t i = 0; i < pooled.size(); ++i)
            for (const auto& range : stats(i).noiseTotals) {
                if (!sides(i).ok)
                    break;  // not compared at this layer: its stats are another layer's
                noiseBase.merge(range[std::size_t(part)][0]);
                noiseActual.merge(range[std::size_t(part)][1]);
            }
        auto mergeNoise = [&](const TokenErrorStats& st, std::int64_t t, LogHistogram& base, LogHistogram& actual) {
            const auto* spans = &st.noise[std::size_t(part)][std::size_t(t) * 2];
            base.merge(spans[0].first, st.noiseCounts(spans[0]), spans[0].size);
            actual.merge(spans[1].first, st.noiseCounts(spans[1]), spans[1].size);
        };
        std::vector<float> baseErrors, actualErrors;
        for (std::size_t i = 0; i < pooled.size(); ++i) {
            const LayerSides& s = sides(i);
            const TokenErrorStats& st = stats(i);
            if (!s.ok)
                continue;
            const LayerRows reference(s.reference), actual(s.actual), base(s.base);
            const std::size_t n = reference.rowSize();
            baseErrors.resize(n);
            actualErrors.resize(n);
            LayerRows::Tile referenceTile, actualTile, baseTile;
            for (std::int64_t t = 0; t < reference.seq(); ++t) {
                if (st.range(part, t).empty())
                    continue;  // not held by every side
                const RowView r = reference.row(part, t, referenceTile);
                rowErrors(r, base.row(part, t, baseTile), reference.heads(), reference.headDim(), baseErrors.data());
                rowErrors(r, actual.row(part, t, actualTile), reference.heads(), reference.headDim(), actualErrors.data());
                combinedBins.add(baseErrors.data(), n, combinedBase);
                combinedBins.add(actualErrors.data(), n, combinedTarget);
                const std::int64_t g = t - promptLen(i);
                if (onePrompt || g < 0 || std::size_t(g) >= gCount)
                    continue;
                const std::size_t gi = std::size_t(g);
                if (reuse[gi]) {
                    for (int b = 0; b < kBcBins; ++b) {
                        indexBase[gi].counts[std::size_t(b)] += st.countsOf(part, t, 0)[b];
                        indexTarget[gi].counts[std::size_t(b)] += st.countsOf(part, t, 1)[b];
                    }
                } else {
                    indexBins[gi].add(baseErrors.data(), n, indexBase[gi]);
                    indexBins[gi].add(actualErrors.data(), n, indexTarget[gi]);
                }
            }
        }
        for (std::size_t g = 0; g < gCount && !onePrompt; ++g)
            if (!byIndex[g].empty())  // no prompt holds this index: no data, not BC 1
                aggregate.bc[std::size_t(part)][std::size_t(layer) * gCount + g] =
                    float(bhattacharyya(indexBase[g], indexTarget[g]));
        aggregate.combined[std::size_t(part)][std::size_t(layer)] = float(bhattacharyya(combinedBase, combinedTarget));
        // By generation index: the prompts' tokens at that index, one index at a time.
        LogHistogram indexNoiseBase, indexNoiseActual;
        for (std::size_t g = 0; g < gCount && !onePrompt; ++g) {
            for (std::size_t i = 0; i < pooled.size(); ++i) {
                const std::int64_t t = promptLen(i) + std::int64_t(g);
                if (sides(i).ok && !stats(i).range(part, t).empty())
                    mergeNoise(stats(i), t, indexNoiseBase, indexNoiseActual);
            }
            aggregate.bcVsNoise[std::size_t(part)][std::size_t(layer) * gCount + g] =
                float(bcVsNoise(indexNoiseBase, indexNoiseActual));
            indexNoiseBase.clear();
            indexNoiseActual.clear();
        }
        aggregate.combinedVsNoise[std::size_t(part)][std::size_t(layer)] = float(bcVsNoise(noiseBase, noiseActual));
    }
}

}  // namespace

AnalysisResult prepareAnalysis(const BundleReader& reader, const AnalysisOptions& options)
{
    const KvCacheConfig& config = reader.config();
    std::vector<std::string> layers = options.layers.empty() ? config.layerNames() : options.layers;
    for (const std::string& layer : layers)
        if (config.groupOf(layer) < 0)
            throw BundleError(reader.path(), "layer '" + layer + "'", "is not a layer of this bundle's config");

    AnalysisResult result;
    result.bundle = reader.path();
    std::vector<const PromptInfo*> prompts;
    if (options.prompts.empty())
        for (const PromptInfo& p : reader.prompts())
            prompts.push_back(&p);
    else
        for (const std::string& id : options.prompts)
            prompts.push_back(&reader.prompt(id));

    for (const PromptInfo* info : prompts) {
        if (!info->problems.empty()) {
            result.problems.insert(result.problems.end(), info->problems.begin(), info->problems.end());
            continue;
        }
        PromptAnalysis p;
        p.id = info->id;
        p.promptLen = info->promptLen;
        p.tokens = info->snapshots.back().seqLen();
        p.heads = config.totalNumKvHeads;
        p.headDim = config.groups.front().headSize;
        p.threeWay = info->hasBaseline;
        p.layers = layers;
        for (const std::string& layer : layers)
            p.layerGroups.push_back(config.groupOf(layer));
        try {
            p.divergences = findDivergences(reader, *info);
        } catch (const BundleError& e) {
            p.problems.push_back(std::string("divergences: ") + e.what());
        }
        p.allocate();
        result.prompts.push_back(std::move(p));
    }

    std::vector<const PromptAnalysis*> threeWay;
    for (const PromptAnalysis& p : result.prompts)
        if (p.threeWay)
            threeWay.push_back(&p);
    if (!threeWay.empty()) {
        AggregateBc agg;
        agg.layers = layers;
        agg.generationCount = std::numeric_limits<std::int64_t>::max();
        for (const PromptAnalysis* p : threeWay) {
            agg.promptIds.push_back(p->id);
            agg.generationCount = std::min(agg.generationCount, std::max<std::int64_t>(0, p->tokens - p->promptLen));
        }
        const float nan = std::numeric_limits<float>::quiet_NaN();
        for (int part = 0; part < 2; ++part) {
            agg.bc[std::size_t(part)].assign(layers.size() * std::size_t(agg.generationCount), nan);
            agg.combined[std::size_t(part)].assign(layers.size(), nan);
            agg.bcVsNoise[std::size_t(part)].assign(layers.size() * std::size_t(agg.generationCount), nan);
            agg.combinedVsNoise[std::size_t(part)].assign(layers.size(), nan);
        }
        agg.divergenceCounts.assign(std::size_t(agg.generationCount), 0);
        for (const PromptAnalysis* p : threeWay)
            for (const Divergence& d : p->divergences) {
                const std::int64_t g = d.position - p->promptLen;
                if (g >= 0 && g < agg.generationCount)
                    ++agg.divergenceCounts[std::size_t(g)];
            }
        result.aggregate = std::move(agg);
    }
    return result;
}

void runAnalysis(std::shared_ptr<const BundleReader> reader, const AnalysisOptions& options, AnalysisResult& result)
{
    const CaptureLoader loader(reader, options.unreadableBlocks);
    const int layerCount = result.prompts.empty() ? 0 : int(result.prompts.front().layers.size());
    std::vector<int> pooled;
    for (std::size_t i = 0; i < result.prompts.size(); ++i)
        if (result.prompts[i].threeWay)
            pooled.push_back(int(i));

    std::atomic<int> layersDone{0};
    std::atomic<bool> failed{false};
    std::exception_ptr failure;
    std::mutex mutex;  // guards problems, nonFinite and `failure`
    auto cancelled = [&] { return failed.load() || (options.cancel && options.cancel->load()); };
    auto fail = [&] {
        std::lock_guard lock(mutex);
        if (!failure)
            failure = std::current_exception();
        failed = true;
    };

    // Fewer layers than threads (a layer selection): the spare threads split each layer's tokens.
    const int threads = std::max(1, options.threads > 0 ? options.threads : int(std::thread::hardware_concurrency()));
    const int layerThreads = std::min(threads, std::max(1, layerCount));
    const int tokenThreads = std::max(1, threads / layerThreads);

    // One layer's sides for every prompt, read; a prompt that could not be read has problems instead.
    struct LayerInputs {
        int layer = -1;
        std::vector<LayerSides> sides;
        std::vector<std::vector<std::string>> problems;
    };
    auto read = [&](int layer) {
        LayerInputs in;
        in.layer = layer;
        in.sides.resize(result.prompts.size());
        in.problems.resize(result.prompts.size());
        for (std::size_t pi = 0; pi < result.prompts.size() && !cancelled(); ++pi) {
            const PromptAnalysis& p = result.prompts[pi];
            const std::string& name = p.layers[std::size_t(layer)];
            LayerSides& s = in.sides[pi];
            try {
                s.actual = loader.engineLayer(p.id, name, &in.problems[pi]);
                if (p.threeWay) {
                    s.reference = loader.referenceSource(p.id, ReferenceRole::Baseline, name);
                    s.base = loader.referenceSource(p.id, ReferenceRole::Expected, name);
                } else {
                    s.reference = loader.referenceSource(p.id, ReferenceRole::Expected, name);
                }
                s.ok = true;
            } catch (const BundleError& e) {
                in.problems[pi].push_back(e.what());
                s = {};
            }
        }
        return in;
    };
    // Compares what was read, pools it, and lets it go. `stats` is the worker's, kept from
    // layer to layer for its buffers.
    auto compare = [&](LayerInputs& in, std::vector<TokenErrorStats>& stats) {
        for (std::size_t pi = 0; pi < result.prompts.size() && !cancelled(); ++pi) {
            PromptAnalysis& p = result.prompts[pi];
            LayerSides& s = in.sides[pi];
            std::vector<NonFiniteCell> nonFinite;
            if (s.ok && p.threeWay) {  // with what pooling needs
                stats[pi].keepCounts = pooled.size() > 1;  // see aggregateLayer
                const LayerRows base(s.base);
                compareLayer(s.reference, s.actual, &base, in.layer, p, nonFinite, &stats[pi], tokenThreads);
            } else if (s.ok) {
                compareLayer(s.reference, s.actual, nullptr, in.layer, p, nonFinite, nullptr, tokenThreads);
            }
            const std::vector<std::string>& problems = in.problems[pi];
            if (!problems.empty() || !nonFinite.empty()) {
                std::lock_guard lock(mutex);
                p.problems.insert(p.problems.end(), problems.begin(), problems.end());
                p.nonFinite.insert(p.nonFinite.end(), nonFinite.begin(), nonFinite.end());
            }
        }
        if (cancelled())
            return;
        if (result.aggregate)
            aggregateLayer(result, pooled, in.sides, stats, in.layer, *result.aggregate);
        const int layer = in.layer;
        in = {};
        const int done = ++layersDone;
        if (options.layerDone)
            options.layerDone(layer, done, layerCount);
    };

    if (layerThreads == 1) {
        try {
            std::vector<TokenErrorStats> stats(result.prompts.size());
            for (int layer = 0; layer < layerCount && !cancelled(); ++layer) {
                LayerInputs in = read(layer);
                compare(in, stats);
            }
        } catch (...) {
            fail();
        }
    } else {
        // One thread reads the layers in order, a layer ahead of the workers, which only
        // compare: reading holds the HDF5 lock, and workers that each read their own layers
        // met there (on two cores, 0.2 s of 1.2 waited on the 32-layer bench capture).
        std::mutex queueMutex;
        std::condition_variable queueChanged;
        std::optional<LayerInputs> ready;
        bool readerDone = false;
        auto waitFor = [&](std::unique_lock<std::mutex>& lock, auto until) {
            while (!until() && !cancelled())  // polls: a cancel request does not notify
                queueChanged.wait_for(lock, std::chrono::milliseconds(50));
        };
        std::thread reader([&] {
            try {
                for (int layer = 0; layer < layerCount && !cancelled(); ++layer) {
                    {
                        // Read only once the last one was taken: at most one layer more in
                        // memory than the workers hold.
                        std::unique_lock lock(queueMutex);
                        waitFor(lock, [&] { return !ready; });
                    }
                    if (cancelled())
                        break;
                    LayerInputs in = read(layer);
                    std::lock_guard lock(queueMutex);
                    ready = std::move(in);
                    queueChanged.notify_all();
                }
            } catch (...) {
                fail();
            }
            std::lock_guard lock(queueMutex);
            readerDone = true;
            queueChanged.notify_all();
        });
        auto work = [&] {
            try {
                std::vector<TokenErrorStats> stats(result.prompts.size());
                while (true) {
                    LayerInputs in;
                    {
                        std::unique_lock lock(queueMutex);
                        waitFor(lock, [&] { return ready || readerDone; });
                        if (cancelled() || !ready)
                            break;
                        in = std::move(*ready);
                        ready.reset();
                    }
                    queueChanged.notify_all();
                    compare(in, stats);
                }
            } catch (...) {
                fail();
            }
        };
        std::vector<std::thread> pool;
        for (int i = 1; i < layerThreads; ++i)
            pool.emplace_back(work);
        work();
        for (std::thread& t : pool)
            t.join();
        reader.join();
    }
    releaseKeptBuffers();
    if (failure)
        std::rethrow_exception(failure);
    if (options.cancel && options.cancel->load())
        throw AnalysisCancelled();
    // Issues arrive in thread order; sort them so that output is reproducible.
    for (PromptAnalysis& p : result.prompts) {
        std::sort(p.problems.begin(), p.problems.end());
        std::sort(p.nonFinite.begin(), p.nonFinite.end(), [](const NonFiniteCell& a, const NonFiniteCell& b) {
            return std::tie(a.layer, a.token, a.head, a.part, a.side) < std::tie(b.layer, b.token, b.head, b.part, b.side);
        });
    }
    std::vector<std::vector<Suspect>> suspects;
    for (PromptAnalysis& p : result.prompts) {
        p.suspects = findSuspects(*reader, p, options.suspects);
        suspects.push_back(p.suspects);
    }
    result.suspects = poolSuspects(suspects);
}

AnalysisResult analyzeBundle(std::shared_ptr<const BundleReader> reader, const AnalysisOptions& options)
{
    AnalysisResult result = prepareAnalysis(*reader, options);
    runAnalysis(std::move(reader), options, result);
    return result;
}

}  // namespace kvscope
