#include "analysis/analyzer.h"

#include "analysis/divergence.h"
#include "analysis/impact_summary.h"
#include "analysis/layer_aggregate.h"
#include "analysis/layer_comparison.h"
#include "analysis/state_analysis.h"
#include "analysis/state_suspects.h"
#include "analysis/structural_evidence.h"
#include "analysis/suspect_search.h"
#include "format/bundle_error.h"
#include "kv/block_sharing.h"
#include "util/buffer_allocator.h"
#include "util/content_hash.h"
#include "util/work_team.h"

#include <algorithm>
#include <cstdlib>
#include <array>
#include <exception>
#include <memory>
#include <limits>
#include <optional>
#include <set>
#include <thread>
#include <tuple>

namespace kvscope {

namespace {

// A window's smallest size and step, in tokens: whole blocks and reference chunks, mostly.
constexpr std::int64_t kGrain = 4096;
// The analysis's first window when its first layer is read in windows: small, so that a viewer
// has the first cells of a long context soon (the first window is read before anything is
// compared; the later ones while the one before is).
constexpr std::int64_t kFirstLook = 1024;

std::vector<std::string> selectedLayers(const CaptureLoader& loader, const AnalysisOptions& options)
{
    const KvCacheConfig& config = loader.config();
    std::vector<std::string> layers = options.layers.empty() ? config.layerNames() : options.layers;
    for (const std::string& layer : layers)
        if (config.groupOf(layer) < 0)
            throw BundleError(loader.path(), "layer '" + layer + "'", "is not a layer of this bundle's config");
        else if (!config.isCompared(layer))
            throw BundleError(loader.path(), "layer '" + layer + "'",
                              "is one of the " + config.groups[std::size_t(config.groupOf(layer))].notComparedWhy +
                                  ", which kvscope does not compare");
    return layers;
}

std::vector<const PromptInfo*> selectedPrompts(const CaptureLoader& loader, const AnalysisOptions& options)
{
    std::vector<const PromptInfo*> prompts;
    if (options.prompts.empty())
        for (const PromptInfo& p : loader.prompts())
            prompts.push_back(&p);
    else
        for (const std::string& id : options.prompts)
            prompts.push_back(&loader.prompt(id));
    return prompts;
}

// What analysing a prompt reads, in bytes: its sides of every layer, roughly.
std::uint64_t promptBytes(const CaptureLoader& loader, const PromptInfo& info, const std::vector<std::string>& layers)
{
    const KvCacheConfig& config = loader.config();
    std::uint64_t perToken = 0;
    for (const std::string& layer : layers) {
        const KvCacheGroup& g = config.groups[std::size_t(config.groupOf(layer))];
        const HeadDims dims = headDimsOf(g);
        perToken += std::uint64_t(g.totalKvHeads) * std::uint64_t(dims.k + dims.v) * (info.hasBaseline ? 3 : 2) * 2;
    }
    return perToken * std::uint64_t(info.snapshots.back().seqLen());
}

// One prompt's result, its shape and divergences, not yet allocated; only its shape when
// another process analyses it (`analysed` false).
PromptAnalysis emptyPrompt(const CaptureLoader& loader, const PromptInfo& info, const std::vector<std::string>& layers,
                           bool analysed)
{
    const KvCacheConfig& config = loader.config();
    PromptAnalysis p;
    p.id = info.id;
    p.inputIds = info.inputIds;
    p.promptLen = info.promptLen;
    p.provenance = info.provenance;
    p.tokens = info.snapshots.back().seqLen();
    const KvCacheGroup& group = layers.empty() ? config.firstCompared() : config.groups[std::size_t(config.groupOf(layers.front()))];
    p.dims = headDimsOf(group);
    for (KvPart part : {KvPart::K, KvPart::V})
        p.partNames[std::size_t(part)] = partLabel(group, part);
    p.threeWay = info.hasBaseline;
    p.layers = layers;
    for (const std::string& layer : layers) {
        p.layerGroups.push_back(config.groupOf(layer));
        p.layerDims.push_back(headDimsOf(config.groups[std::size_t(p.layerGroups.back())]));
        p.layerDtypes.push_back(config.groups[std::size_t(p.layerGroups.back())].layerDType());
        p.layerHeads.push_back(config.groups[std::size_t(p.layerGroups.back())].totalKvHeads);
    }
    for (std::vector<std::uint64_t>& hashes : p.referenceHashes)
        hashes.assign(layers.size(), 0);
    p.heads = p.layerHeads.empty() ? group.totalKvHeads : *std::max_element(p.layerHeads.begin(), p.layerHeads.end());
    if (!analysed)
        return p;
    try {
        p.divergences = findDivergences(loader, info);
    } catch (const BundleError& e) {
        p.problems.push_back(std::string("divergences: ") + e.what());
    }
    return p;
}

// The across-prompt BC of the three-way prompts, all NaN, with the divergence counts (of every
// process's prompts, with a share); none without three-way prompts.
std::optional<AggregateBc> emptyAggregate(const std::vector<PromptAnalysis>& prompts, const std::vector<std::string>& layers,
                                          AnalysisShare* share)
{
    std::vector<const PromptAnalysis*> threeWay;
    for (const PromptAnalysis& p : prompts)
        if (p.threeWay)
            threeWay.push_back(&p);
    if (threeWay.empty())
        return std::nullopt;
    AggregateBc agg;
    agg.layers = layers;
    agg.generationCount = std::numeric_limits<std::int64_t>::max();
    for (const PromptAnalysis* p : threeWay) {
        agg.promptIds.push_back(p->id);
        agg.generationCount = std::min(agg.generationCount, std::max<std::int64_t>(0, p->tokens - p->promptLen));
    }
    const float nan = std::numeric_limits<float>::quiet_NaN();
    const std::size_t cells = layers.size() * std::size_t(agg.generationCount);
    for (int part = 0; part < 2; ++part) {
        agg.bc[std::size_t(part)].assign(cells, nan);
        agg.combined[std::size_t(part)].assign(layers.size(), nan);
        agg.bcVsNoise[std::size_t(part)].assign(cells, nan);
        agg.combinedVsNoise[std::size_t(part)].assign(layers.size(), nan);
    }
    agg.divergenceCounts.assign(std::size_t(agg.generationCount), 0);
    for (const PromptAnalysis* p : threeWay)
        for (const Divergence& d : p->divergences) {
            const std::int64_t g = d.position - p->promptLen;
            if (g >= 0 && g < agg.generationCount)
                ++agg.divergenceCounts[std::size_t(g)];
        }
    if (share) {
        std::vector<std::uint64_t> counts(agg.divergenceCounts.begin(), agg.divergenceCounts.end());
        share->sum(counts);
        agg.divergenceCounts.assign(counts.begin(), counts.end());
    }
    return agg;
}

// What a layer's windows of tokens carry from one to the next, per prompt.
struct LayerProgress {
    std::vector<char> failed;                        // a window could not be read: the layer is not analysed
    std::vector<std::array<ContentHash, 2>> hashes;  // the references read so far: [expected, baseline]
    std::vector<char> scalesRead;                    // the quantised cache's scales taken
};

// One step of the stream: a window of tokens of one layer, for a batch of prompts (all of them,
// unless their sides would take more than a window's bytes together: a sweep's hundreds).
struct Step {
    int layer = 0;
    PositionRange window = PositionRange::all();
    std::size_t firstPrompt = 0, endPrompt = 0;  // the batch
    bool firstWindow = true;   // of the batch's windows of this layer
    bool lastWindow = true;
    bool firstOfLayer = true;  // the layer's first step, and its last
    bool lastOfLayer = true;
    bool holds(std::size_t prompt) const { return prompt >= firstPrompt && prompt < endPrompt; }
};

// One window of one layer's sides for the step's batch of prompts; a prompt that could not be read has
// problems instead.
struct LayerInputs {
    Step step;
    std::shared_ptr<LayerProgress> progress;
    std::vector<LayerSides> sides;
    std::vector<std::vector<std::string>> problems;
    std::vector<std::vector<ReplicaDifference>> replicas;  // per prompt (replicated TP only)
    // Per prompt, the error reading each side (engine, reference, base); the first is
    // reported, as if the sides were read in that order and the rest then left.
    std::vector<std::array<std::string, 3>> errors;
    std::vector<char> newlyFailed;  // per prompt: this window could not be read, earlier ones were

    auto firstError(std::size_t prompt) const
    {
        return std::find_if(errors[prompt].begin(), errors[prompt].end(), [](const std::string& e) { return !e.empty(); });
    }
};

// The layers of a prepared result compared one at a time, a window of tokens at a time, by
// every thread together (chunks of tokens), while one of them reads the next window; then
// the suspects.
class AnalysisRun {
public:
    AnalysisRun(const CaptureLoader& loader, const AnalysisOptions& options, AnalysisResult& result)
        : m_loader(loader)
        , m_options(options)
        , m_result(result)
        , m_sharing(loader, promptIds(result))
        , m_stats(result.prompts.size())
        , m_layerCount(result.prompts.empty() ? 0 : int(result.prompts.front().layers.size()))
    {
        for (std::size_t i = 0; i < result.prompts.size(); ++i) {
            if (result.prompts[i].threeWay)
                m_pooled.push_back(int(i));
            m_counted.push_back(result.prompts[i].threeWay ? 1 : 0);
        }
        const int threads =
            std::max(1, options.threads > 0 ? options.threads : int(std::thread::hardware_concurrency()));
        if (threads > 1)
            m_team.emplace(threads);
        for (int layer = 0; layer < m_layerCount; ++layer)
            addSteps(layer);
    }

    // Every layer compared and pooled. Throws the first failure, or AnalysisCancelled.
    void streamLayers();
    // The state-space layers' recurrent states of every prompt this process analyses.
    void compareStates();
    // The suspects of every prompt, and the bundle's pooled.
    void findAllSuspects();

private:
    WorkTeam* team() { return m_team ? &*m_team : nullptr; }
    // Whether this process analyses the prompt (all of them, without a share).
    bool owns(std::size_t prompt) const { return !m_options.share || m_options.share->analyses(prompt); }
    bool cancelled() const { return m_failed.load() || (m_options.cancel && m_options.cancel->load()); }
    // The steps of `layer`: its prompts in batches whose sides fit a window's bytes together,
    // each batch whole, or in windows of tokens when its sides would take more and its
    // references are chunked along their positions (older bundles store a reference row as one
    // chunk, which every window would read whole: read once, as before).
    void addSteps(int layer);
    // The batches of prompts a layer is read in (prompt index ranges), by what each prompt's
    // sides take per token.
    std::vector<PositionRange> promptBatches(const std::vector<std::size_t>& bytesPerToken, std::size_t budget) const;
    bool referenceChunksExceed(int layer, PositionRange batch, std::int64_t windowTokens) const;
    // The sides of the step's batch of prompts in its window; with a `team` (the first step, which
    // nothing else overlaps), all at once.
    void read(LayerInputs& in, const Step& step, const std::shared_ptr<LayerProgress>& progress, WorkTeam* team);
    void readSide(LayerInputs& in, std::size_t prompt, int side, bool oneAfterAnother);
    // Compares what was read, pools it at the layer's last window, and lets it go.
    // `readNext` reads the next step's sides; compare posts it to a helper where it would
    // otherwise wait (the second pass of a windowed layer), and returns whether it did.
    bool compare(LayerInputs& in, const std::function<void()>& readNext);
    // The pooled BCs of a layer compared in several windows: its windows read again for the
    // second pass over the shared bins, each while the one before is counted (at most two
    // windows in memory, as in the first pass); `readNext` posted while the last is counted.
    bool poolWindowedLayer(LayerInputs& last, const std::function<void()>& readNext);
    bool secondPassFollows(const Step& step) const
    {
        return m_result.aggregate && step.lastOfLayer && !step.firstOfLayer;
    }

    static std::vector<std::string> promptIds(const AnalysisResult& result)
    {
        std::vector<std::string> ids;
        for (const PromptAnalysis& p : result.prompts)
            ids.push_back(p.id);
        return ids;
    }
    // Says which suspects lie in a block other prompts share (prefix caching).
    void noteSharedBlocks(std::size_t prompt, std::vector<Suspect>& suspects) const;

    const CaptureLoader& m_loader;
    const AnalysisOptions& m_options;
    AnalysisResult& m_result;
    const BlockSharing m_sharing;             // blocks prompts share (prefix caching)
    std::vector<int> m_pooled;                // the three-way prompts
    std::vector<char> m_counted;              // [prompt]: pooled
    std::vector<TokenErrorStats> m_stats;     // per prompt, kept from layer to layer for its buffers
    const int m_layerCount;
    std::vector<Step> m_steps;
    int m_layersDone = 0;
    std::atomic<bool> m_failed{false};        // the reads still posted then do nothing
    std::optional<WorkTeam> m_team;
};

void AnalysisRun::addSteps(int layer)
{
    const std::size_t budget = m_options.windowBytes > 0 ? m_options.windowBytes : kWindowBytes;
    const std::size_t prompts = m_result.prompts.size();
    std::vector<std::size_t> bytesPerToken(prompts, 0);  // every side, as float32 (another process's: none)
    for (std::size_t i = 0; i < prompts; ++i) {
        const PromptAnalysis& p = m_result.prompts[i];
        const HeadDims dims = p.layerDims[std::size_t(layer)];
        if (owns(i))
            bytesPerToken[i] = std::size_t(p.headsOf(layer)) * std::size_t(dims.k + dims.v) * sizeof(float) * (p.threeWay ? 3 : 2);
    }
    const std::size_t firstStep = m_steps.size();
    for (const PositionRange batch : promptBatches(bytesPerToken, budget)) {
        std::int64_t tokens = 0;
        std::size_t batchBytesPerToken = 0;
        for (std::size_t i = std::size_t(batch.begin); i < std::size_t(batch.end); ++i) {
            tokens = std::max(tokens, m_result.prompts[i].tokens);
            batchBytesPerToken += bytesPerToken[i];
        }
        std::vector<PositionRange> windows = analysisWindows(tokens, batchBytesPerToken, m_options.windowTokens, budget);
        if (windows.size() > 1 && m_options.windowTokens <= 0 && referenceChunksExceed(layer, batch, windows.front().end))
            windows = {PositionRange::all()};  // each window would read (and verify) whole chunks again
        if (m_steps.empty() && windows.size() > 1 && m_options.windowTokens <= 0 &&
            !referenceChunksExceed(layer, batch, kFirstLook)) {
            windows.front().begin = kFirstLook;
            windows.insert(windows.begin(), PositionRange{0, kFirstLook});
        }
        for (std::size_t w = 0; w < windows.size(); ++w)
            m_steps.push_back({layer, windows[w], std::size_t(batch.begin), std::size_t(batch.end), w == 0,
                               w + 1 == windows.size(), false, false});
    }
    m_steps[firstStep].firstOfLayer = true;
    m_steps.back().lastOfLayer = true;
}

std::vector<PositionRange> AnalysisRun::promptBatches(const std::vector<std::size_t>& bytesPerToken, std::size_t budget) const
{
    // Prompts in order, a batch as long as its smallest windows (4,096 tokens, or the whole
    // prompt) fit the budget together; one prompt at least.
    std::vector<PositionRange> batches;
    std::size_t bytes = 0;
    for (std::size_t i = 0; i < bytesPerToken.size(); ++i) {
        const std::size_t least = bytesPerToken[i] * std::size_t(std::min(kGrain, m_result.prompts[i].tokens));
        if (batches.empty() || (bytes + least > budget && bytes > 0)) {
            batches.push_back({std::int64_t(i), std::int64_t(i)});
            bytes = 0;
        }
        batches.back().end = std::int64_t(i) + 1;
        bytes += least;
    }
    return batches;
}

bool AnalysisRun::referenceChunksExceed(int layer, PositionRange batch, std::int64_t windowTokens) const
{
    for (std::size_t i = std::size_t(batch.begin); i < std::size_t(batch.end); ++i) {
        const PromptAnalysis& p = m_result.prompts[i];
        for (ReferenceRole role : {ReferenceRole::Expected, ReferenceRole::Baseline}) {
            if ((role == ReferenceRole::Baseline && !p.threeWay) || !owns(i))
                continue;
            try {
                if (m_loader.referencePositionsPerChunk(p.id, role, p.layers[std::size_t(layer)]) > windowTokens)
                    return true;
            } catch (const BundleError&) {  // reading the layer reports it
            }
        }
    }
    return false;
}

void AnalysisRun::readSide(LayerInputs& in, std::size_t prompt, int side, bool oneAfterAnother)
{
    const PromptAnalysis& p = m_result.prompts[prompt];
    const std::string& name = p.layers[std::size_t(in.step.layer)];
    LayerSides& s = in.sides[prompt];
    LayerProgress& progress = *in.progress;
    if (!owns(prompt) || !in.step.holds(prompt) || cancelled() || progress.failed[prompt] ||
        (oneAfterAnother && in.firstError(prompt) != in.errors[prompt].end()))
        return;  // read one after another: the sides after a failure are left
    try {
        if (side == 0) {
            s.actual = m_loader.engineSource(p.id, name, &in.problems[prompt], in.step.window);
            try {  // a replica that cannot be read is a problem of its own, not the layer's
                in.replicas[prompt] = findReplicaDifferences(m_loader, p.id, name, in.step.window);
            } catch (const BundleError& e) {
                in.problems[prompt].push_back(std::string("replicas: ") + e.what());
            }
        } else if (side == 1 || p.threeWay) {
            // Three-way: the baseline is the reference, expected the base; two-way: expected the reference.
            const ReferenceRole role = side == 1 && p.threeWay ? ReferenceRole::Baseline : ReferenceRole::Expected;
            LayerSource& source = side == 1 ? s.reference : s.base;
            source = m_loader.referenceSource(p.id, role, name, in.step.window);
            if (m_options.fingerprints) {
                ContentHash& hash = progress.hashes[prompt][role == ReferenceRole::Baseline ? 1 : 0];
                if (in.step.firstWindow)
                    hash = source.startHash();
                source.addToHash(hash, in.step.window);
            }
        }
    } catch (const BundleError& e) {
        in.errors[prompt][std::size_t(side)] = e.what();
    }
}

void AnalysisRun::read(LayerInputs& in, const Step& step, const std::shared_ptr<LayerProgress>& progress, WorkTeam* team)
{
    const std::size_t prompts = m_result.prompts.size();
    in.step = step;
    in.progress = progress;
    in.sides.resize(prompts);
    in.problems.resize(prompts);
    in.replicas.resize(prompts);
    in.errors.resize(prompts);
    in.newlyFailed.assign(prompts, 0);
    const std::size_t first = step.firstPrompt, batch = step.endPrompt - step.firstPrompt;
    if (team)
        team->run(int(batch) * 3, [&](int task, int) { readSide(in, first + std::size_t(task / 3), task % 3, false); });
    else
        for (std::size_t task = 0; task < batch * 3; ++task)
            readSide(in, first + task / 3, int(task % 3), true);
    for (std::size_t pi = 0; pi < prompts; ++pi) {
        const auto failed = in.firstError(pi);
        LayerSides& s = in.sides[pi];
        s.ok = owns(pi) && step.holds(pi) && failed == in.errors[pi].end() && !progress->failed[pi] && !cancelled();
        if (failed != in.errors[pi].end()) {
            in.problems[pi].push_back(*failed);
            in.newlyFailed[pi] = 1;
            progress->failed[pi] = 1;
            s = {};
        }
    }
}

namespace {

// The scales a quantised layer's cache declares, at its first present position.
CacheScales cacheScalesOf(const LayerSource& engine)
{
    CacheScales scales;
    for (std::int64_t pos = 0; pos < engine.seq; ++pos) {
        if (!engine.present[std::size_t(pos)])
            continue;
        for (KvPart part : {KvPart::K, KvPart::V})
            for (int h = 0; h < engine.heads; ++h) {
                const LayerSource::Storage storage = engine.storedAs(part, pos, h);
                if (part == KvPart::K)  // (an fp8_ds_mla k_pe is bf16: K's granularity is the cache's)
                    scales.granularity = storage.granularity;
                if (storage.granularity != ScaleGranularity::TokenHead && storage.granularity != ScaleGranularity::TokenGroup)
                    scales.heads[std::size_t(part)].push_back(storage.scale);
            }
        break;
    }
    return scales;
}

}  // namespace

bool AnalysisRun::compare(LayerInputs& in, const std::function<void()>& readNext)
{
    LayerProgress& progress = *in.progress;
    for (std::size_t pi = in.step.firstPrompt; pi < in.step.endPrompt && !cancelled(); ++pi) {
        if (!owns(pi))
            continue;
        PromptAnalysis& p = m_result.prompts[pi];
        LayerSides& s = in.sides[pi];
        std::vector<NonFiniteCell> nonFinite;
        if (in.newlyFailed[pi] && !in.step.firstWindow)
            p.clearLayer(in.step.layer);  // as if the whole layer had been read, and failed
        // The scales at the layer's first present position: in the first window that has one.
        if (s.ok && isQuantised(p.layerDtypes[std::size_t(in.step.layer)]) && !progress.scalesRead[pi] &&
            std::find(s.actual.present.begin(), s.actual.present.end(), 1) != s.actual.present.end()) {
            p.cacheScales[std::size_t(in.step.layer)] = cacheScalesOf(s.actual);
            progress.scalesRead[pi] = 1;
        }
        if (s.ok && p.threeWay) {  // with what pooling needs
            if (in.step.firstWindow) {
                m_stats[pi].keepCounts = m_pooled.size() > 1 && m_options.bcs &&  // see aggregateLayer
                                         (m_options.bcs->perToken || m_options.bcs->perTokenVsNoise);
                // (the tokens at generation indices: no other token's counts are read)
                m_stats[pi].kept = {p.promptLen, p.promptLen + (m_result.aggregate ? m_result.aggregate->generationCount : 0)};
                // A block an earlier prompt holds too is pooled there (its tokens counted once).
                m_stats[pi].pooledElsewhere =
                    m_sharing.heldEarlierMask(pi, p.layerGroups[std::size_t(in.step.layer)], p.tokens, m_counted);
            }
            const LayerRows base(s.base);
            compareLayer(s.reference, s.actual, &base, in.step.layer, p, nonFinite, m_options.bcs ? &m_stats[pi] : nullptr, team(),
                         m_options.bcs, in.step.window);
        } else if (s.ok) {
            compareLayer(s.reference, s.actual, nullptr, in.step.layer, p, nonFinite, nullptr, team(), BcNeeds{}, in.step.window);
        }
        p.problems.insert(p.problems.end(), in.problems[pi].begin(), in.problems[pi].end());
        mergeReplicaDifferences(p.replicaDifferences, in.replicas[pi]);
        p.nonFinite.insert(p.nonFinite.end(), nonFinite.begin(), nonFinite.end());
        if (in.step.lastWindow && m_options.fingerprints)
            for (std::size_t role = 0; role < 2; ++role)
                p.referenceHashes[role][std::size_t(in.step.layer)] =
                    progress.failed[pi] || (role == 1 && !p.threeWay) ? 0 : progress.hashes[pi][role].value();
    }
    if (cancelled())
        return false;
    bool readPosted = false;
    if (m_result.aggregate && in.step.lastOfLayer) {
        if (in.step.firstOfLayer) {  // the layer in one step: its sides are all here
            aggregateLayer(m_result, m_pooled, in.sides, m_stats, in.step.layer, *m_result.aggregate, team(), m_options.share,
                           *m_options.bcs);  // (an aggregate only with BCs)
        } else {  // the second pass: this window from its sides, the others read again
            readPosted = poolWindowedLayer(in, readNext);
        }
    }
    const Step step = in.step;
    in = {};
    if (!cancelled() && !step.lastOfLayer && m_options.windowDone)
        m_options.windowDone(step.layer, step.firstPrompt, step.endPrompt, step.window.end);
    if (cancelled() || !step.lastOfLayer)  // a layer pooled in part is not done
        return readPosted;
    ++m_layersDone;
    if (m_options.layerDone)
        m_options.layerDone(step.layer, m_layersDone, m_layerCount);
    for (std::size_t pi = 0; pi < m_result.prompts.size(); ++pi)  // (spilled results: the layer goes to its file)
        if (owns(pi))
            m_result.prompts[pi].releaseLayer(step.layer);
    return readPosted;
}

namespace {

// One window of a layer's sides read again for the second pass, or why it could not be.
struct PooledWindow {
    std::vector<LayerSides> sides;
    std::vector<std::array<std::string, 3>> errors;  // per prompt: reading its engine, baseline, expected
    std::string problem;
};

}  // namespace

bool AnalysisRun::poolWindowedLayer(LayerInputs& last, const std::function<void()>& readNext)
{
    std::vector<char> compared(m_result.prompts.size());
    for (std::size_t pi = 0; pi < compared.size(); ++pi)
        compared[pi] = owns(pi) && !last.progress->failed[pi];
    const int layer = last.step.layer;
    WindowedLayerPooling pooling(m_result, m_pooled, compared, m_stats, layer, *m_result.aggregate, team(),
                                 m_options.share, *m_options.bcs);
    const auto isLast = [&](const Step& step) {
        return step.window == last.step.window && step.firstPrompt == last.step.firstPrompt;
    };
    std::vector<const Step*> again;  // the layer's other windows
    for (const Step& step : m_steps)
        if (step.layer == layer && !isLast(step))
            again.push_back(&step);
    if (!pooling.needsSides())
        again.clear();
    // Only the pooled prompts' references and engine, read as the first pass read them: the
    // prompts to read, then each side (one task each), then the first error, if any.
    const auto prepare = [&](const Step& step, PooledWindow& out) {
        out.sides.clear();
        out.sides.resize(m_result.prompts.size());
        out.errors.assign(m_result.prompts.size(), {});
        std::vector<int> read;
        for (int pi : m_pooled)
            if (compared[std::size_t(pi)] && step.holds(std::size_t(pi)))
                read.push_back(pi);
        return read;
    };
    const auto readSideAgain = [&](const Step& step, int pi, int side, PooledWindow& out) {
        if (cancelled())
            return;
        const PromptAnalysis& p = m_result.prompts[std::size_t(pi)];
        const std::string& name = p.layers[std::size_t(layer)];
        LayerSides& s = out.sides[std::size_t(pi)];
        try {
            if (side == 0)
                s.actual = m_loader.engineSource(p.id, name, nullptr, step.window);
            else
                (side == 1 ? s.reference : s.base) = m_loader.referenceSource(
                    p.id, side == 1 ? ReferenceRole::Baseline : ReferenceRole::Expected, name, step.window);
        } catch (const BundleError& e) {
            out.errors[std::size_t(pi)][std::size_t(side)] = e.what();
        }
    };
    const auto settle = [&](const std::vector<int>& read, PooledWindow& out) {
        for (int pi : read) {
            for (const std::string& error : out.errors[std::size_t(pi)])
                if (!error.empty()) {
                    // Read once, not twice (the file changed?): this layer's pooled BCs stay NaN, said so.
                    const PromptAnalysis& p = m_result.prompts[std::size_t(pi)];
                    out.problem = "pooled BC of layer '" + p.layers[std::size_t(layer)] + "': prompt " + p.id + ": " + error;
                    out.sides.clear();
                    return;
                }
            out.sides[std::size_t(pi)].ok = !cancelled();
        }
    };
    PooledWindow ahead;  // the window read ahead
    std::vector<int> readingAhead;  // the prompts whose sides it holds
    WorkTeam* const working = team();
    // A read ahead writes into `ahead`: leaving this frame by an exception waits for the read
    // first (declared after what the reads write into, so it runs before they go).
    struct WaitForReads {
        WorkTeam* team;
        ~WaitForReads()
        {
            if (team && std::uncaught_exceptions() > 0)
                try {
                    team->waitPosted();
                } catch (...) {  // the first failure is the one reported
                }
        }
    } waitForReads{working};
    bool readPosted = false;
    // Reads `again[i]` into `into`, a task per side for the helpers and the analysing thread
    // once it has counted, or, after the last, the next step's sides. (Without a team each
    // window is read when its turn comes: one window in memory.)
    const auto readAhead = [&](std::size_t i, PooledWindow& into) {
        if (!working)
            return;
        if (i < again.size()) {
            readingAhead = prepare(*again[i], into);
            for (int pi : readingAhead)
                for (int side = 0; side < 3; ++side)
                    working->post([&, i, pi, side] { readSideAgain(*again[i], pi, side, into); });
        } else if (readNext) {
            working->post(readNext);
            readPosted = true;
        }
    };
    // The window just compared is counted from the sides in hand (a pooled prompt's are ok
    // exactly where it is compared and in the batch), first, and freed before the others are
    // read again: counts add up in any order.
    readAhead(0, ahead);
    if (pooling.needsSides() && !cancelled())
        pooling.count(last.sides, last.step.window);
    last.sides.clear();
    bool unreadable = false;
    for (std::size_t i = 0; i < again.size(); ++i) {
        if (working) {
            working->waitPosted();
        } else {
            readingAhead = prepare(*again[i], ahead);
            for (int pi : readingAhead)
                for (int side = 0; side < 3 && (side == 0 || ahead.errors[std::size_t(pi)][side - 1].empty()); ++side)
                    readSideAgain(*again[i], pi, side, ahead);
        }
        settle(readingAhead, ahead);
        PooledWindow window = std::move(ahead);
        ahead = {};
        if (cancelled())
            return readPosted;
        if (!window.problem.empty()) {  // (nothing is read ahead of it)
            m_result.problems.push_back(window.problem);
            unreadable = true;
            break;
        }
        readAhead(i + 1, ahead);
        pooling.count(window.sides, again[i]->window);
    }
    pooling.finish(unreadable);
    return readPosted;
}

void AnalysisRun::streamLayers()
{
    WorkTeam* const working = team();
    std::exception_ptr failure;
    const std::size_t prompts = m_result.prompts.size();
    auto progressFor = [&](const Step& step, const std::shared_ptr<LayerProgress>& current) {
        if (!step.firstOfLayer)
            return current;
        auto fresh = std::make_shared<LayerProgress>();
        fresh->failed.assign(prompts, 0);
        fresh->hashes.resize(prompts);
        fresh->scalesRead.assign(prompts, 0);
        return fresh;
    };
    LayerInputs next;  // read while `in` is compared
    std::shared_ptr<LayerProgress> progress;
    try {
        if (!m_steps.empty()) {
            progress = progressFor(m_steps[0], progress);
            read(next, m_steps[0], progress, working);
        }
        for (std::size_t step = 0; step < m_steps.size() && !cancelled(); ++step) {
            if (working)
                working->waitPosted();
            LayerInputs in = std::move(next);
            next = {};
            // A helper reads the next window (one task: reading mostly waits on the file and the
            // HDF5 lock) while the others compare this one.
            const bool more = step + 1 < m_steps.size();
            if (more)
                progress = progressFor(m_steps[step + 1], progress);
            const std::function<void()> readNext = [this, &next, step, progress] {
                read(next, m_steps[step + 1], progress, nullptr);
            };
            // A windowed layer's last window posts it itself, after its second pass's reads.
            const bool postedByCompare = more && working && secondPassFollows(in.step);
            if (more && working && !postedByCompare)
                working->post(readNext);
            const bool posted = compare(in, more ? readNext : std::function<void()>{});
            if (more && (!working || (postedByCompare && !posted)))
                readNext();
        }
        if (working)
            working->waitPosted();  // a read posted before a cancel
    } catch (...) {
        failure = std::current_exception();
        m_failed = true;
        try {
            if (working)
                working->waitPosted();  // a read still running refers to `next`
        } catch (...) {  // the first failure is the one reported
        }
    }
    releaseKeptBuffers();
    if (failure)
        std::rethrow_exception(failure);
    if (m_options.cancel && m_options.cancel->load())
        throw AnalysisCancelled();
}

void AnalysisRun::noteSharedBlocks(std::size_t prompt, std::vector<Suspect>& suspects) const
{
    const PromptAnalysis& p = m_result.prompts[prompt];
    for (Suspect& s : suspects) {
        const auto layer = std::find(p.layers.begin(), p.layers.end(), s.firstLayer);
        if (layer == p.layers.end())
            continue;
        const int group = p.layerGroups[std::size_t(layer - p.layers.begin())];
        const BlockSharing::Sharing shared = m_sharing.sharedAt(prompt, group, s.firstToken);
        if (shared.prompts.empty())
            continue;
        s.sharedBlock = shared.physical;
        s.sharedBy = shared.prompts;
        std::string who;
        for (const std::string& id : shared.prompts)
            who += (who.empty() ? "" : ", ") + id;
        s.evidence += " Token " + std::to_string(s.firstToken) + " lies in physical block " +
                      std::to_string(shared.physical) + " of group " + std::to_string(group) +
                      ", which prompts " + who + " share (prefix caching): one KV, so one fault for all of them.";
    }
}

void AnalysisRun::compareStates()
{
    const std::vector<std::string> order = modelLayerOrder(m_loader.config());
    for (std::size_t i = 0; i < m_result.prompts.size(); ++i) {
        if (!owns(i))
            continue;
        PromptAnalysis& p = m_result.prompts[i];
        p.states = analyzePromptStates(m_loader, m_loader.prompt(p.id), order, m_options.suspects);
        for (const StateLayerAnalysis& a : p.states)
            if (!a.problem.empty())
                p.problems.push_back(a.problem);
    }
}

void AnalysisRun::findAllSuspects()
{
    std::vector<std::vector<Suspect>> suspects;
    for (std::size_t i = 0; i < m_result.prompts.size(); ++i) {
        if (!owns(i))
            continue;
        PromptAnalysis& p = m_result.prompts[i];
        p.suspects = findSuspects(m_loader, p, m_options.suspects, nullptr, team());
        if (!p.states.empty())
            addStateSuspects(m_loader, p, promptIds(m_result), modelLayerOrder(m_loader.config()), m_options.suspects);
        noteSharedBlocks(i, p.suspects);
        suspects.push_back(p.suspects);
    }
    if (!m_options.share) {  // else pooled where the prompts are gathered
        m_result.suspects = poolSuspects(suspects);
        addStructuralEvidence(m_result.suspects, m_result.prompts, m_loader.config());
    }
}

// Problems, non-finite cells and replica differences sorted, so that output is reproducible
// (and the same whatever windows the layers were read in).
void sortFindings(AnalysisResult& result)
{
    for (PromptAnalysis& p : result.prompts) {
        std::sort(p.problems.begin(), p.problems.end());
        // A block's problem is found by each window it spans.
        p.problems.erase(std::unique(p.problems.begin(), p.problems.end()), p.problems.end());
        auto layerIndex = [&p](const ReplicaDifference& d) { return std::find(p.layers.begin(), p.layers.end(), d.layer) - p.layers.begin(); };
        std::stable_sort(p.replicaDifferences.begin(), p.replicaDifferences.end(),
                         [&](const ReplicaDifference& a, const ReplicaDifference& b) {
                             return std::tuple(layerIndex(a), a.snapshot, a.againstRank, a.rank) <
                                    std::tuple(layerIndex(b), b.snapshot, b.againstRank, b.rank);
                         });
        std::sort(p.nonFinite.begin(), p.nonFinite.end(), [](const NonFiniteCell& a, const NonFiniteCell& b) {
            return std::tie(a.layer, a.token, a.head, a.part, a.side) < std::tie(b.layer, b.token, b.head, b.part, b.side);
        });
    }
}

}  // namespace

std::vector<PositionRange> analysisWindows(std::int64_t tokens, std::size_t bytesPerToken, std::int64_t windowTokens,
                                          std::size_t budget)
{
    std::int64_t window = windowTokens;
    if (window <= 0) {  // whole multiples of 4,096 tokens: whole blocks and reference chunks, mostly
        window = std::max<std::int64_t>(kGrain, std::int64_t(budget / std::max<std::size_t>(1, bytesPerToken)) / kGrain * kGrain);
    }
    if (tokens <= window)
        return {PositionRange::all()};
    std::vector<PositionRange> windows;
    for (std::int64_t begin = 0; begin < tokens; begin += window)
        windows.push_back({begin, std::min(tokens, begin + window)});
    return windows;
}

std::size_t resultsInMemoryBytes()
{
    const char* megabytes = std::getenv("KVSCOPE_RESULTS_IN_MEMORY_MB");
    if (!megabytes || !*megabytes)
        return kResultsInMemoryBytes;
    char* end = nullptr;
    const unsigned long long mb = std::strtoull(megabytes, &end, 10);
    return *end ? kResultsInMemoryBytes : std::max<std::size_t>(1, std::size_t(mb) << 20);
}

std::string resultsSpillDirectory(std::size_t bytes, std::size_t budget, const std::string& directory)
{
    // (with what the process holds already: results read or analysed earlier, another rank's part)
    const std::size_t held = SpillableArray::bytesInMemory();
    if (bytes <= budget && held <= budget - bytes)
        return {};
    return directory.empty() ? defaultSpillDirectory() : directory;
}

AnalysisResult prepareAnalysis(const CaptureLoader& loader, const AnalysisOptions& options)
{
    const std::vector<std::string> layers = selectedLayers(loader, options);
    AnalysisResult result;
    result.bundle = loader.path();
    result.notCompared = loader.config().notComparedLayers();
    // State-space layers whose recurrent state the bundle holds are compared (state_analysis.h).
    std::set<std::string> stateLayers;
    for (const PromptInfo& info : loader.prompts())
        stateLayers.insert(info.stateLayers.begin(), info.stateLayers.end());
    std::erase_if(result.notCompared, [&](const auto& layer) { return stateLayers.count(layer.first) > 0; });
    std::vector<const PromptInfo*> analysable;
    for (const PromptInfo* info : selectedPrompts(loader, options)) {
        if (info->problems.empty())
            analysable.push_back(info);
        else
            result.problems.insert(result.problems.end(), info->problems.begin(), info->problems.end());
    }
    if (options.share) {
        std::vector<std::string> ids;
        std::vector<std::uint64_t> bytes;
        for (const PromptInfo* info : analysable) {
            ids.push_back(info->id);
            bytes.push_back(promptBytes(loader, *info, layers));
        }
        options.share->shareOut(ids, bytes);
    }
    std::size_t resultBytes = 0;
    for (std::size_t i = 0; i < analysable.size(); ++i) {
        const bool analysed = !options.share || options.share->analyses(i);
        result.prompts.push_back(emptyPrompt(loader, *analysable[i], layers, analysed));
        resultBytes += analysed ? result.prompts.back().resultBytes() : 0;
    }
    const std::string spillTo = resultsSpillDirectory(
        resultBytes, options.resultsInMemoryBytes ? options.resultsInMemoryBytes : resultsInMemoryBytes(), options.spillDirectory);
    for (std::size_t i = 0; i < analysable.size(); ++i)
        if (!options.share || options.share->analyses(i))
            result.prompts[i].allocate(spillTo);
    if (options.bcs)
        result.aggregate = emptyAggregate(result.prompts, layers, options.share);
    return result;
}

// What the engine's KV does to the output, where the bundle measured it: read for every prompt
// (gathered ones too) and said for each suspect.
void sayImpact(const CaptureLoader& loader, AnalysisResult& result)
{
    readImpacts(loader, result.prompts);
    attachImpact(result.suspects, result.prompts);
    for (PromptAnalysis& p : result.prompts)
        attachImpact(p.suspects, result.prompts);
}

void runAnalysis(const CaptureLoader& loader, const AnalysisOptions& options, AnalysisResult& result)
{
    AnalysisRun run(loader, options, result);
    run.streamLayers();
    run.compareStates();
    sortFindings(result);
    if (options.searchSuspects)
        run.findAllSuspects();
    if (!options.share) {
        sayImpact(loader, result);
        return;
    }
    if (!options.share->gather(result, loader))
        throw AnalysisHandedOver();
    if (options.searchSuspects) {  // every prompt's are here now: pooled as one process pools them
        std::vector<std::vector<Suspect>> suspects;
        for (const PromptAnalysis& p : result.prompts)
            suspects.push_back(p.suspects);
        result.suspects = poolSuspects(suspects);
        addStructuralEvidence(result.suspects, result.prompts, loader.config());
    }
    sayImpact(loader, result);
}

AnalysisResult prepareAnalysis(const Sweep& sweep, const AnalysisOptions& options)
{
    if (!sweep.loader) {
        std::string why;
        for (const SweepBundle& b : sweep.bundles)
            why += "\n  " + b.problem;
        throw BundleError(sweep.label, {}, "no bundle of the sweep can be analysed:" + why);
    }
    AnalysisResult result = prepareAnalysis(*sweep.loader, options);
    result.bundles = sweep.bundles;
    return result;
}

AnalysisResult analyzeSweep(const Sweep& sweep, const AnalysisOptions& options)
{
    AnalysisResult result = prepareAnalysis(sweep, options);
    runAnalysis(*sweep.loader, options, result);
    return result;
}

AnalysisResult analyzeBundle(std::shared_ptr<const BundleReader> reader, const AnalysisOptions& options)
{
    const CaptureLoader loader(std::move(reader), options.unreadableBlocks, options.referenceDonor);
    AnalysisResult result = prepareAnalysis(loader, options);
    runAnalysis(loader, options, result);
    return result;
}

}  // namespace kvscope
