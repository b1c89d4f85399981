#include "analysis/map_spec.h"

#include <algorithm>

namespace kvscope {

ScaleKind scaleOf(HeatmapMetric metric)
{
    if (metric == HeatmapMetric::Bc || metric == HeatmapMetric::BcVsNoise)
        return ScaleKind::Bc;
    return metric == HeatmapMetric::ErrorRatio ? ScaleKind::Ratio : ScaleKind::Error;
}

const char* scaleName(ScaleKind kind)
{
    return kind == ScaleKind::Bc         ? "bc"
           : kind == ScaleKind::Ratio    ? "ratio"
           : kind == ScaleKind::Change   ? "change"
           : kind == ScaleKind::Transfer ? "transfer"
                                         : "error";
}

const std::vector<ColorStop>& colorStops(ScaleKind kind)
{
    // Errors: YlOrRd.
    static const std::vector<ColorStop> error{
        {0.0, {255, 255, 204}}, {0.25, {254, 217, 118}}, {0.5, {253, 141, 60}}, {0.75, {227, 26, 28}}, {1.0, {128, 0, 38}}};
    // Ratio, log10 from 0.1 to 1000 (at = (log10 x + 1) / 4): quiet grey-green to half the
    // threshold, pale yellow to orange up to it, then red darkening to deep purple at 1000x.
    static const std::vector<ColorStop> ratio{{0.0, {226, 235, 222}},    {0.1747, {226, 235, 222}}, {0.18, {255, 246, 191}},
                                              {0.2495, {253, 174, 97}},  {0.25, {215, 48, 31}},    {0.5, {165, 0, 38}},
                                              {0.75, {103, 0, 13}},      {1.0, {63, 0, 125}}};
    // BC: red below the check's 0.8, orange to pale yellow up to 0.9, and above it the ratio's
    // quiet colour: a clean layer's tokens (1,000 values or more, analysis_result.h) read
    // 0.94-0.99, and must not look like anything.
    static const std::vector<ColorStop> bc{{0.0, {215, 25, 28}},    {0.8, {215, 25, 28}},    {0.85, {253, 174, 97}},
                                           {0.90, {255, 246, 191}}, {0.92, {226, 235, 222}}, {1.0, {226, 235, 222}}};
    // Change: RdBu reversed, white at 0 (the middle of a range symmetric about 0).
    static const std::vector<ColorStop> change{
        {0.0, {33, 102, 172}}, {0.25, {146, 197, 222}}, {0.5, {247, 247, 247}}, {0.75, {244, 165, 130}}, {1.0, {178, 24, 43}}};
    // Transfer: three bands over -0.5..2.5, the ratio's quiet colour for identical.
    static const std::vector<ColorStop> transfer{{0.0, {226, 235, 222}},   {0.333, {226, 235, 222}}, {0.334, {253, 174, 97}},
                                                 {0.666, {253, 174, 97}}, {0.667, {215, 48, 31}},   {1.0, {215, 48, 31}}};
    return kind == ScaleKind::Bc         ? bc
           : kind == ScaleKind::Ratio    ? ratio
           : kind == ScaleKind::Change   ? change
           : kind == ScaleKind::Transfer ? transfer
                                         : error;
}

ValueRange defaultRange(ScaleKind kind)
{
    switch (kind) {
    case ScaleKind::Error:
        return {0.0, 0.2};
    case ScaleKind::Ratio:
        return {0.1, 1000.0};
    case ScaleKind::Bc:
        return {0.0, 1.0};
    case ScaleKind::Change:
        return {-10.0, 10.0};
    case ScaleKind::Transfer:
        return {-0.5, 2.5};
    }
    return {0.0, 1.0};
}

std::vector<std::pair<double, std::string>> legendWords(ScaleKind kind)
{
    if (kind == ScaleKind::Transfer)
        return {{0.0, "identical"}, {1.0, "explained"}, {2.0, "unexplained"}};
    if (kind != ScaleKind::Ratio)
        return {};
    return {{kNoiseShareOfOff, "noise"}, {1.0, "off"}, {10.0, "10x off"}, {100.0, "100x"}, {1000.0, "1000x"}};
}

const char* legendTitle(ScaleKind kind)
{
    return kind == ScaleKind::Ratio ? "error / off threshold" : kind == ScaleKind::Transfer ? "changed?" : "";
}

namespace {

// The q-quantile (0..1) of `values` (reordered), by the nearest rank.
double quantile(std::vector<float>& values, double q)
{
    const std::size_t k = std::min(values.size() - 1, std::size_t(q * double(values.size())));
    std::nth_element(values.begin(), values.begin() + std::ptrdiff_t(k), values.end());
    return double(values[k]);
}

}  // namespace

ValueRange dataRange(const PromptAnalysis& p, const HeatmapSpec& spec, bool logarithmic, const std::vector<char>* rowsReady)
{
    const ScaleKind scale = scaleOf(spec.metric);
    if (scale == ScaleKind::Ratio)
        return defaultRange(scale);  // fixed: noise is quiet whatever the data
    if (scale == ScaleKind::Bc)
        return logarithmic ? ValueRange{0.5, 1.0} : defaultRange(scale);
    std::vector<float> noise, values;
    for (int l = 0; l < int(p.layers.size()); ++l) {
        if (rowsReady && (std::size_t(l) >= rowsReady->size() || !(*rowsReady)[std::size_t(l)]))
            continue;
        for (std::int64_t t = 0; t < p.tokens; ++t) {
            if (const float v = heatmapValue(p, spec, l, t); std::isfinite(v))
                values.push_back(v);
            if (const float b = heatmapBaseValue(p, spec, l, t); std::isfinite(b))
                noise.push_back(b);
        }
        p.releaseLayer(l);
    }
    if (values.empty())
        return logarithmic ? ValueRange{1e-4, defaultRange(scale).upper} : defaultRange(scale);
    double upper = noise.empty() ? quantile(values, 0.99) : 2 * quantile(noise, 0.99);
    std::vector<float> positive;
    for (float v : noise.empty() ? values : noise)
        if (v > 0)
            positive.push_back(v);
    const double smallest = positive.empty() ? 0 : quantile(positive, 0.01);
    if (!(upper > 0))  // all zero: any positive range shows that
        upper = std::max(smallest, 1e-6);
    if (!logarithmic)
        return {0.0, upper};
    const double lower = smallest > 0 && smallest < upper ? smallest : upper * 1e-3;
    return {lower, upper};
}

std::string shortLayerName(const std::string& layer)
{
    // HF names the attention module "...self_attn"; vLLM its Attention layer under it "...self_attn.attn".
    for (const std::string suffix : {".self_attn.attn", ".self_attn", ".attn"})
        if (layer.size() > suffix.size() && layer.compare(layer.size() - suffix.size(), suffix.size(), suffix) == 0)
            return layer.substr(0, layer.size() - suffix.size());
    return layer;
}

std::string layerRowLabel(const KvCacheConfig& config, const std::string& layer)
{
    const int g = config.groupOf(layer);
    if (g < 0)
        return shortLayerName(layer);
    const KvCacheGroup& group = config.groups[std::size_t(g)];
    std::string kind = "full";
    if (group.specType == SpecType::Mla)
        kind = "MLA";
    else if (group.specType == SpecType::ChunkedLocal)
        kind = "chunked " + std::to_string(*group.attentionChunkSize);
    else if (group.attentionChunkSize)
        kind = "full, chunk " + std::to_string(*group.attentionChunkSize);
    else if (group.slidingWindow)
        kind = group.specType == SpecType::SlidingWindow ? "sliding " + std::to_string(*group.slidingWindow)
                                                         : "sliding " + std::to_string(*group.slidingWindow) + ", cached as full";
    return shortLayerName(layer) + " [" + kind + "]";
}

std::string mapMetricLabel(const HeatmapSpec& spec, const PromptAnalysis& prompt)
{
    std::string label = partName(prompt, spec.part) + " " + heatmapMetricName(spec.metric);
    if (spec.metric == HeatmapMetric::ErrorRatio)  // what a floor is here
        label += prompt.threeWay ? " (L-inf over what bf16 alone does there)"
                                 : " (relative L2 over the cache dtype's rounding; no fp32 baseline)";
    if (spec.metric == HeatmapMetric::Bc || spec.metric == HeatmapMetric::BcVsNoise || prompt.heads == 1)
        return label;  // (an MLA latent is one vector: nothing to reduce over)
    switch (spec.reduction) {
    case HeadReductionKind::Max: return label + ", max over heads";
    case HeadReductionKind::Mean: return label + ", mean over heads";
    case HeadReductionKind::OneHead: return label + ", head " + std::to_string(spec.head);
    }
    return label;
}

MapSpec promptMapSpec(const KvCacheConfig& config, const PromptAnalysis& prompt, const PromptInfo& info,
                      const HeatmapSpec& spec, bool withSuspect)
{
    MapSpec m;
    m.metricLabel = mapMetricLabel(spec, prompt);
    m.title = prompt.id + ": " + m.metricLabel;
    m.scale = scaleOf(spec.metric);
    m.range = defaultRange(m.scale);
    for (const std::string& layer : prompt.layers) {
        m.rowLabels.push_back(layerRowLabel(config, layer));
        m.layerNames.push_back(layer);
    }
    m.tokenText = info.tokenStrings;
    m.prefillBoundary = double(prompt.promptLen) - 0.5;
    for (const Divergence& d : prompt.divergences)
        m.divergences.push_back(d.position);
    m.provenance = prompt.provenance;
    if (withSuspect && !prompt.suspects.empty()) {
        const Suspect& s = prompt.suspects.front();
        const auto rowOf = [&](const std::string& layer) {
            const auto at = std::find(prompt.layers.begin(), prompt.layers.end(), layer);
            return at == prompt.layers.end() ? -1 : int(at - prompt.layers.begin());
        };
        m.onsetRow = rowOf(s.firstLayer);
        for (std::size_t i = 1; i < s.layers.size(); ++i)
            if (const int row = rowOf(s.layers[i]); row >= 0 && row != m.onsetRow)
                m.spreadRows.push_back(row);
        if (!m.spreadRows.empty())
            m.spreadLabel = "spread from " + shortLayerName(s.firstLayer);
    }
    return m;
}

MapSpec acrossPromptsMapSpec(const KvCacheConfig& config, const AnalysisResult& result, KvPart part, bool vsNoise)
{
    const AggregateBc& aggregate = *result.aggregate;
    MapSpec m;
    m.metricLabel = std::string(partLabel(config.firstCompared(), part)) + (vsNoise ? " BC vs noise" : " BC (reference tool)");
    m.title = m.metricLabel + " by generation index across " + std::to_string(aggregate.promptIds.size()) +
              " prompt(s) (top: divergences c/N)";
    if (vsNoise && !generationBcMeaningful(result))  // (aggregateHeatmap leaves it empty)
        m.title = m.metricLabel + " by generation index: not drawn, an index pools " +
                  std::to_string(smallestGenerationValues(result)) + " values (" + std::to_string(aggregate.promptIds.size()) +
                  " prompt(s)), too few for a BC to mean anything (at least " + std::to_string(kMinValuesForTokenBc) +
                  "); the combined BC per layer pools every token";
    m.xName = "generation index";
    // Decode positions only: a fault confined to the prefill is not here (the suspects give the onset).
    m.xLabel = "generation index (decode only, 0 = first decode token: the prefill is not shown)";
    m.scale = ScaleKind::Bc;
    m.range = defaultRange(m.scale);
    for (const std::string& layer : aggregate.layers) {
        m.rowLabels.push_back(layerRowLabel(config, layer));
        m.layerNames.push_back(layer);
    }
    for (std::int64_t g = 0; g < aggregate.generationCount; ++g)
        if (const int c = aggregate.divergenceCounts[std::size_t(g)]; c > 0)
            m.topLabels.emplace_back(g, std::to_string(c) + "/" + std::to_string(aggregate.promptIds.size()));
    return m;
}

}  // namespace kvscope
