#include "analysis/analyzer.h"

#include "analysis/suspects.h"

#include "format/bundle_error.h"
#include "util/buffer_allocator.h"
#include "kv/capture_loader.h"
#include "analysis/divergence.h"
#include "analysis/layer_aggregate.h"
#include "analysis/layer_comparison.h"
#include "util/work_team.h"

#include <algorithm>
#include <array>
#include <exception>
#include <limits>
#include <optional>
#include <thread>
#include <tuple>

namespace kvscope {

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

    int layersDone = 0;
    std::atomic<bool> failed{false};  // the reads still posted then do nothing
    std::exception_ptr failure;
    auto cancelled = [&] { return failed.load() || (options.cancel && options.cancel->load()); };

    const int threads = std::max(1, options.threads > 0 ? options.threads : int(std::thread::hardware_concurrency()));
    // The threads work on one layer at a time, together (chunks of tokens), and read the next
    // layer meanwhile: reading a layer's sides are tasks beside the comparing ones.
    std::optional<WorkTeam> team;
    if (threads > 1)
        team.emplace(threads);
    WorkTeam* const working = team ? &*team : nullptr;

    // One layer's sides for every prompt; a prompt that could not be read has problems instead.
    struct LayerInputs {
        int layer = -1;
        std::vector<LayerSides> sides;
        std::vector<std::vector<std::string>> problems;
        // Per prompt, the error reading each side (engine, reference, base); the first is
        // reported, as if the sides were read in that order and the rest then left.
        std::vector<std::array<std::string, 3>> errors;
    };
    // Reads the sides of every prompt; with a `team` (the first layer, which nothing else
    // overlaps), all at once.
    auto read = [&](LayerInputs& in, int layer, WorkTeam* team) {
        const std::size_t prompts = result.prompts.size();
        in.layer = layer;
        in.sides.resize(prompts);
        in.problems.resize(prompts);
        in.errors.resize(prompts);
        auto firstError = [&](std::size_t pi) {
            return std::find_if(in.errors[pi].begin(), in.errors[pi].end(), [](const std::string& e) { return !e.empty(); });
        };
        auto readSide = [&](std::size_t pi, int side) {
            const PromptAnalysis& p = result.prompts[pi];
            const std::string& name = p.layers[std::size_t(layer)];
            LayerSides& s = in.sides[pi];
            if (cancelled() || (!team && firstError(pi) != in.errors[pi].end()))
                return;  // read one after another: the sides after a failure are left
            try {
                if (side == 0)
                    s.actual = loader.engineSource(p.id, name, &in.problems[pi]);
                else if (side == 1)
                    s.reference = loader.referenceSource(p.id, p.threeWay ? ReferenceRole::Baseline : ReferenceRole::Expected, name);
                else if (p.threeWay)
                    s.base = loader.referenceSource(p.id, ReferenceRole::Expected, name);
            } catch (const BundleError& e) {
                in.errors[pi][std::size_t(side)] = e.what();
            }
        };
        if (team)
            team->run(int(prompts) * 3, [&](int task, int) { readSide(std::size_t(task / 3), task % 3); });
        else
            for (std::size_t task = 0; task < prompts * 3; ++task)
                readSide(task / 3, int(task % 3));
        for (std::size_t pi = 0; pi < prompts; ++pi) {
            const auto failed = firstError(pi);
            LayerSides& s = in.sides[pi];
            s.ok = failed == in.errors[pi].end() && !cancelled();
            if (failed != in.errors[pi].end()) {
                in.problems[pi].push_back(*failed);
                s = {};
            }
        }
    };
    // Compares what was read, pools it, and lets it go. `stats` (per prompt) is kept from
    // layer to layer for its buffers.
    std::vector<TokenErrorStats> stats(result.prompts.size());
    auto compare = [&](LayerInputs& in) {
        for (std::size_t pi = 0; pi < result.prompts.size() && !cancelled(); ++pi) {
            PromptAnalysis& p = result.prompts[pi];
            LayerSides& s = in.sides[pi];
            std::vector<NonFiniteCell> nonFinite;
            if (s.ok && p.threeWay) {  // with what pooling needs
                stats[pi].keepCounts = pooled.size() > 1;  // see aggregateLayer
                const LayerRows base(s.base);
                compareLayer(s.reference, s.actual, &base, in.layer, p, nonFinite, &stats[pi], working);
            } else if (s.ok) {
                compareLayer(s.reference, s.actual, nullptr, in.layer, p, nonFinite, nullptr, working);
            }
            p.problems.insert(p.problems.end(), in.problems[pi].begin(), in.problems[pi].end());
            p.nonFinite.insert(p.nonFinite.end(), nonFinite.begin(), nonFinite.end());
        }
        if (cancelled())
            return;
        if (result.aggregate)
            aggregateLayer(result, pooled, in.sides, stats, in.layer, *result.aggregate, working);
        const int layer = in.layer;
        in = {};
        ++layersDone;
        if (options.layerDone)
            options.layerDone(layer, layersDone, layerCount);
    };

    LayerInputs next;  // read while `in` is compared
    try {
        if (layerCount > 0)
            read(next, 0, working);
        for (int layer = 0; layer < layerCount && !cancelled(); ++layer) {
            if (working)
                working->waitPosted();
            LayerInputs in = std::move(next);
            next = {};
            // A helper reads the next layer (one task: reading mostly waits on the file and the
            // HDF5 lock) while the others compare this one.
            if (layer + 1 < layerCount && working)
                working->post([&, layer] { read(next, layer + 1, nullptr); });
            compare(in);
            if (layer + 1 < layerCount && !working)
                read(next, layer + 1, nullptr);
        }
        if (working)
            working->waitPosted();  // a read posted before a cancel
    } catch (...) {
        failure = std::current_exception();
        failed = true;
        try {
            if (working)
                working->waitPosted();  // a read still running refers to `next`
        } catch (...) {  // the first failure is the one reported
        }
    }
    releaseKeptBuffers();
    if (failure)
        std::rethrow_exception(failure);
    if (options.cancel && options.cancel->load())
        throw AnalysisCancelled();
    // Sorted, as they always were, so that output is reproducible.
    for (PromptAnalysis& p : result.prompts) {
        std::sort(p.problems.begin(), p.problems.end());
        std::sort(p.nonFinite.begin(), p.nonFinite.end(), [](const NonFiniteCell& a, const NonFiniteCell& b) {
            return std::tie(a.layer, a.token, a.head, a.part, a.side) < std::tie(b.layer, b.token, b.head, b.part, b.side);
        });
    }
    std::vector<std::vector<Suspect>> suspects;
    for (PromptAnalysis& p : result.prompts) {
        p.suspects = findSuspects(*reader, p, options.suspects, nullptr, working);
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
