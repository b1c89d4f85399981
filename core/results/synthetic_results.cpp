#include "results/synthetic_results.h"

#include "analysis/analyzer.h"
#include "results/results_writer.h"

#include <cmath>
#include <stdexcept>

namespace kvscope {

namespace {

// A uniform value in [0, 1) for each cell and draw, the same on every machine.
float uniform(std::uint64_t seed, std::uint64_t cell, std::uint64_t draw)
{
    std::uint64_t x = seed * 0x9e3779b97f4a7c15ull + cell * 0xbf58476d1ce4e5b9ull + draw * 0x94d049bb133111ebull;
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebull;
    x ^= x >> 31;
    return float(x >> 40) / float(1 << 24);
}

BundleOutline fixtureOutline(const std::string& path, const SyntheticResultsOptions& o)
{
    KvCacheGroup group;
    for (int l = 0; l < o.layers; ++l)
        group.layerNames.push_back("model.layers." + std::to_string(l) + ".self_attn");
    group.specName = "FullAttentionSpec";
    group.blockSize = 16;
    group.dtype = DType::BFloat16;
    group.totalKvHeads = o.kvHeads;
    group.numKvHeads = std::max(1, o.kvHeads / 8);
    group.headSize = 128;
    KvCacheConfig config;
    config.groups.push_back(group);
    config.tpSize = 8;
    config.totalNumKvHeads = o.kvHeads;
    config.numBlocks = int(o.tokens / 16 + 2);
    BundleOutline outline;
    outline.path = path;
    outline.metadata.model = "synthetic (results made without a capture)";
    outline.metadata.engine = "none: kvscope synth --results";
    outline.metadata.notes = "A results file made without a capture, to test viewers at full size.";
    outline.config = KvCacheConfig::fromJson(config.toJson(), {}, "synthetic results config");
    PromptInfo prompt;
    prompt.id = "prompt_0";
    prompt.promptLen = o.tokens / 2;
    for (std::int64_t t = 0; t < prompt.promptLen; ++t)
        prompt.inputIds.push_back(3 + std::int64_t(uniform(o.seed, std::uint64_t(t), 99) * 32000));
    SnapshotInfo snapshot;  // one engine snapshot of the whole sequence, as a capture without divergence has
    snapshot.seqLens = {o.tokens};
    snapshot.validatedUntil = o.tokens;
    prompt.snapshots.push_back(snapshot);
    prompt.hasExpected = true;
    prompt.hasBaseline = o.threeWay;
    outline.prompts.push_back(prompt);
    return outline;
}

// Layer `layer`'s cells: noise around a bf16 floor, a fault in one head late in the prompt.
void fillLayer(PromptAnalysis& p, const SyntheticResultsOptions& o, int layer)
{
    const bool faultyLayer = layer >= o.layers * 5 / 8;
    for (std::int64_t t = 0; t < p.tokens; ++t) {
        const bool faultyToken = faultyLayer && t >= p.tokens * 3 / 4;
        for (int h = 0; h < p.heads; ++h) {
            const std::size_t at = p.cell(layer, t, h);
            for (KvPart part : {KvPart::K, KvPart::V}) {
                const std::uint64_t cell = at * 2 + std::uint64_t(part);
                const float floor = 0.0039f * (0.4f + 0.6f * uniform(o.seed, cell, 0)) * std::sqrt(float(layer + 1) / 8.0f);
                const float spread = std::exp(0.5f * (uniform(o.seed, cell, 1) + uniform(o.seed, cell, 2) - 1.0f));
                const float linf = floor * spread * (faultyToken && h == 3 % p.heads ? 25.0f : 1.0f);
                const float l2 = 0.35f * linf, baseL2 = 0.35f * floor;
                p.metrics[std::size_t(metricFor(part, MetricKind::Linf))][at] = linf;
                p.metrics[std::size_t(metricFor(part, MetricKind::L2))][at] = l2;
                p.metrics[std::size_t(metricFor(part, MetricKind::Cos))][at] = 1.0f - 0.5f * l2 * l2;
                if (p.threeWay) {
                    p.metrics[std::size_t(baseOf(metricFor(part, MetricKind::Linf)))][at] = floor;
                    p.metrics[std::size_t(baseOf(metricFor(part, MetricKind::L2)))][at] = baseL2;
                    p.metrics[std::size_t(baseOf(metricFor(part, MetricKind::Cos)))][at] = 1.0f - 0.5f * baseL2 * baseL2;
                }
            }
        }
        if (p.threeWay)
            for (KvPart part : {KvPart::K, KvPart::V}) {
                const std::size_t at = std::size_t(layer) * std::size_t(p.tokens) + std::size_t(t);
                const float bc = faultyToken ? 0.7f : 0.995f + 0.004f * uniform(o.seed, at * 2 + std::uint64_t(part), 3);
                p.bc[std::size_t(part)][at] = bc;
                p.bcVsNoise[std::size_t(part)][at] = std::min(1.0f, bc + 0.002f);
            }
    }
}

}  // namespace

void writeSyntheticResults(const std::string& path, const SyntheticResultsOptions& o)
{
    if (o.layers < 1 || o.tokens < 2 || o.kvHeads < 1 || o.kvHeads > 1024)
        throw std::invalid_argument("synthetic results need at least 1 layer, 2 tokens and 1-1024 KV heads");
    const BundleOutline outline = fixtureOutline(path + ".no-capture.h5", o);
    AnalysisResult result;
    result.bundle = outline.path;
    PromptAnalysis p;
    p.id = outline.prompts.front().id;
    p.inputIds = outline.prompts.front().inputIds;
    p.promptLen = outline.prompts.front().promptLen;
    p.tokens = o.tokens;
    p.heads = o.kvHeads;
    p.dims = HeadDims(128);
    p.threeWay = o.threeWay;
    p.layers = outline.config.groups.front().layerNames;
    p.layerHeads.assign(p.layers.size(), o.kvHeads);
    p.layerDims.assign(p.layers.size(), HeadDims(128));
    p.layerGroups.assign(p.layers.size(), 0);
    p.layerDtypes.assign(p.layers.size(), DType::BFloat16);
    // (as an analysis has them: a two-way prompt's baseline fingerprints are 0, it has none)
    p.referenceHashes[0].assign(p.layers.size(), o.seed);
    p.referenceHashes[1].assign(p.layers.size(), o.threeWay ? o.seed : 0);
    p.allocate(resultsSpillDirectory(p.resultBytes(), resultsInMemoryBytes()));
    result.prompts.push_back(std::move(p));
    RecordedOptions recorded;
    recorded.bc = o.threeWay;
    recorded.searchSuspects = false;  // (the suspects explain the KV: there is none)
    ResultsWriter writer(path, outline, result, recorded);
    for (int l = 0; l < o.layers; ++l) {
        fillLayer(result.prompts.front(), o, l);
        result.prompts.front().releaseLayer(l);  // (spilled: to the file until the writer's thread reads it)
        writer.writeLayer(result, l);
    }
    writer.finish(result);
}

}  // namespace kvscope
