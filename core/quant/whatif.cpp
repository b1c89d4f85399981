#include "quant/whatif.h"

#include "util/short_number.h"
#include "format/bundle_error.h"
#include "quant/quantiser.h"
#include "util/median.h"
#include "util/work_team.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <mutex>
#include <sstream>

namespace kvscope {

namespace {

// |a - b|_2 / |b|_2 over n values (NaN when b is zero).
double relativeL2(const float* a, const float* b, int n)
{
    double diff = 0, ref = 0;
    for (int i = 0; i < n; ++i) {
        const double d = double(a[i]) - double(b[i]);
        diff += d * d;
        ref += double(b[i]) * double(b[i]);
    }
    return ref > 0 ? std::sqrt(diff / ref) : std::nan("");
}

// What one layer adds to each scheme's result, gathered by the layer's own task.
struct LayerWork {
    std::vector<std::vector<double>> relL2[2];  // [part][scheme]: every cell
    std::vector<std::vector<std::vector<double>>> headRelL2[2];  // [part][scheme][head]
    std::vector<std::vector<double>> ratio[2];
    std::vector<QuantiseStats> stats[2];         // [part][scheme]
    std::vector<std::vector<WhatIfCell>> worst;  // [scheme]
    std::vector<float> floors[2];                // [part]: for the bf16 floor's median over the capture
    double kOutlier = 0;
};

// The `keep` cells with the largest floor ratios, worst first.
void keepWorst(std::vector<WhatIfCell>& cells, std::size_t keep)
{
    const auto worse = [](const WhatIfCell& a, const WhatIfCell& b) { return a.floorRatio > b.floorRatio; };
    if (cells.size() > keep) {
        std::partial_sort(cells.begin(), cells.begin() + std::ptrdiff_t(keep), cells.end(), worse);
        cells.resize(keep);
    }
}

}  // namespace

double bf16RoundingFloor(const float* x, int n)
{
    double err = 0, ref = 0;
    for (int i = 0; i < n; ++i) {
        const double v = std::fabs(double(x[i]));
        ref += v * v;
        if (v > 0) {
            const double ulp = std::ldexp(1.0, std::ilogb(v) - 7);
            err += ulp * ulp / 12.0;
        }
    }
    return ref > 0 ? std::sqrt(err / ref) : std::nan("");
}

namespace {

// The result's prompts (those with an expected reference), its floor, and each scheme's maps
// filled with NaN; `baseline`: every prompt has an fp32 baseline.
WhatIfResult startResult(const CaptureLoader& loader, const WhatIfOptions& options, bool& baseline)
{
    WhatIfResult result;
    result.bundle = loader.path();
    if (loader.config().isMla())  // its schemes quantise per KV head; an MLA latent has no heads to scale
        throw BundleError(loader.path(), "kv_cache_config",
                          "what-if simulates per-head quantisation of K and V; an MLA cache's latent (c_kv, k_pe) is "
                          "not simulated");
    result.layers = loader.config().layerNames();
    const std::vector<PromptInfo>& prompts = loader.prompts();
    baseline = !prompts.empty();
    for (const PromptInfo& p : prompts) {
        if (!p.problems.empty() || !p.hasExpected) {
            result.problems.push_back("prompt " + p.id + ": " + (p.problems.empty() ? "no expected reference" : p.problems.front()));
            continue;
        }
        result.promptIds.push_back(p.id);
        result.promptTokens.push_back(loader.sequenceLength(p.id));
        baseline = baseline && p.hasBaseline;
    }
    result.floor = baseline ? "baseline" : "bf16_rounding";
    const std::size_t layers = result.layers.size();
    for (const QuantScheme& s : options.schemes) {
        WhatIfScheme out{s, std::vector<WhatIfLayer>(layers), 0, 0, {}, {}};
        for (std::int64_t tokens : result.promptTokens) {
            std::array<std::vector<float>, 2> map;
            for (auto& part : map)
                part.assign(layers * std::size_t(tokens), std::numeric_limits<float>::quiet_NaN());
            out.maps.push_back(std::move(map));
        }
        result.schemes.push_back(std::move(out));
    }
    return result;
}

// One layer of the what-if, on its own task: every prompt's reference quantised with every
// scheme, each cell's error against its bf16 floor, then the layer's summary per scheme.
class LayerPass {
public:
    LayerPass(const CaptureLoader& loader, const WhatIfOptions& options, WhatIfResult& result, bool baseline,
              LayerWork& work, int layer)
        : m_loader(loader), m_options(options), m_result(result), m_baseline(baseline), m_w(work), m_l(layer),
          m_layer(result.layers[std::size_t(layer)]), m_schemes(options.schemes.size()),
          m_keep(std::size_t(std::max(1, options.worstCells)))
    {
    }

    void run()
    {
        for (auto* perPart : {&m_w.relL2, &m_w.ratio})
            for (auto& v : *perPart)
                v.assign(m_schemes, {});
        for (auto& v : m_w.stats)
            v.assign(m_schemes, {});
        for (auto& v : m_w.headRelL2)
            v.assign(m_schemes, std::vector<std::vector<double>>(std::size_t(m_loader.config().layoutOf(m_layer).totalHeads)));
        m_w.worst.assign(m_schemes, {});
        for (std::size_t pi = 0; pi < m_result.promptIds.size(); ++pi)
            addPrompt(pi);
        // K's outlier channels: the largest channel amax over the median channel's.
        std::vector<double> amax = m_channelAmax;
        const double typical = medianInPlace(amax);
        m_w.kOutlier = typical > 0 ? *std::max_element(m_channelAmax.begin(), m_channelAmax.end()) / typical : 0;
        summarise();
    }

private:
    void addPrompt(std::size_t pi)
    {
        const std::string& id = m_result.promptIds[pi];
        const LayerKv expected = m_loader.referenceLayer(id, ReferenceRole::Expected, m_layer);
        const std::optional<LayerKv> base =
            m_baseline ? std::optional(m_loader.referenceLayer(id, ReferenceRole::Baseline, m_layer)) : std::nullopt;
        if (pi == 0)  // vLLM's warm-up batch: the first prompt's prefill
            takeWarmup(expected, m_loader.prompt(id).promptLen);
        const std::size_t row = expected.rowSize(KvPart::K);
        for (std::int64_t t = 0; t < expected.seq; ++t)
            if (expected.present[std::size_t(t)])
                for (std::size_t i = 0; i < row; ++i)
                    m_channelAmax[i] = std::max(m_channelAmax[i], double(std::fabs(expected.k[std::size_t(t) * row + i])));
        const std::array<std::vector<double>, 2> floors{cellFloors(expected, base, KvPart::K),
                                                        cellFloors(expected, base, KvPart::V)};
        m_quantised.resize(std::size_t(expected.seq) * row);
        for (std::size_t si = 0; si < m_schemes; ++si)
            for (KvPart part : {KvPart::K, KvPart::V})
                quantiseWith(si, part, pi, expected, floors[std::size_t(part)]);
    }

    void takeWarmup(const LayerKv& expected, std::int64_t promptLen)
    {
        const std::size_t row = expected.rowSize(KvPart::K);
        for (std::int64_t t = 0; t < std::min(promptLen, expected.seq); ++t)
            if (expected.present[std::size_t(t)])
                for (std::size_t i = 0; i < row; ++i) {
                    m_warmupAmax[0] = std::max(m_warmupAmax[0], std::fabs(expected.k[std::size_t(t) * row + i]));
                    m_warmupAmax[1] = std::max(m_warmupAmax[1], std::fabs(expected.v[std::size_t(t) * row + i]));
                }
        m_channelAmax.assign(row, 0.0);
    }

    // Each cell's bf16 floor (NaN where the cell has no data).
    std::vector<double> cellFloors(const LayerKv& expected, const std::optional<LayerKv>& base, KvPart part)
    {
        const int heads = expected.heads, dim = expected.headDim(KvPart::K);  // K and V alike (not MLA)
        const std::size_t row = expected.rowSize(KvPart::K);
        const FloatBuffer& e = part == KvPart::K ? expected.k : expected.v;
        std::vector<double> f(std::size_t(expected.seq) * std::size_t(heads), std::nan(""));
        for (std::int64_t t = 0; t < expected.seq; ++t) {
            if (!expected.present[std::size_t(t)] || (base && !base->present[std::size_t(t)]))
                continue;
            for (int h = 0; h < heads; ++h) {
                const std::size_t at = std::size_t(t) * row + std::size_t(h) * std::size_t(dim);
                f[std::size_t(t) * std::size_t(heads) + std::size_t(h)] =
                    base ? relativeL2(e.data() + at, (part == KvPart::K ? base->k : base->v).data() + at, dim)
                         : bf16RoundingFloor(e.data() + at, dim);
                m_w.floors[std::size_t(part)].push_back(float(f[std::size_t(t) * std::size_t(heads) + std::size_t(h)]));
            }
        }
        return f;
    }

    // Prompt `pi`'s `part` quantised with scheme `si`: each cell's error, its worst cells, the map.
    void quantiseWith(std::size_t si, KvPart part, std::size_t pi, const LayerKv& expected, const std::vector<double>& floor)
    {
        const int heads = expected.heads, dim = expected.headDim(KvPart::K);
        const std::size_t row = expected.rowSize(KvPart::K), pk = std::size_t(part);
        const FloatBuffer& e = part == KvPart::K ? expected.k : expected.v;
        const QuantiseInput in{e.data(), expected.present.data(), expected.seq, heads, dim, part == KvPart::K,
                               m_warmupAmax[pk]};
        const QuantiseStats st = quantise(m_options.schemes[si], in, m_quantised.data());
        m_w.stats[pk][si].values += st.values;
        m_w.stats[pk][si].saturated += st.saturated;
        std::vector<float>& map = m_result.schemes[si].maps[pi][pk];
        std::vector<WhatIfCell>& worst = m_w.worst[si];
        for (std::int64_t t = 0; t < expected.seq; ++t) {
            float worstOfToken = std::numeric_limits<float>::quiet_NaN();
            for (int h = 0; h < heads; ++h) {
                const double f = floor[std::size_t(t) * std::size_t(heads) + std::size_t(h)];
                if (std::isnan(f))
                    continue;
                const std::size_t at = std::size_t(t) * row + std::size_t(h) * std::size_t(dim);
                const double r = relativeL2(m_quantised.data() + at, e.data() + at, dim);
                if (std::isnan(r))
                    continue;
                const double ratio = r / std::max(f, 1e-12);
                m_w.relL2[pk][si].push_back(r);
                m_w.headRelL2[pk][si][std::size_t(h)].push_back(r);
                m_w.ratio[pk][si].push_back(ratio);
                if (!(float(ratio) <= worstOfToken))
                    worstOfToken = float(ratio);
                worst.push_back({m_result.promptIds[pi], t, h, part, r, ratio});
                if (worst.size() >= 4 * m_keep)  // only the worst few: memory stays small
                    keepWorst(worst, m_keep);
            }
            map[std::size_t(m_l) * std::size_t(expected.seq) + std::size_t(t)] = worstOfToken;
        }
        keepWorst(worst, m_keep);
    }

    // The 90th percentile over every prompt's tokens of the layer's map (a token's worst head):
    // what the median of cells hides when most are untouched, as the map shows it.
    double tokenP90(const WhatIfScheme& scheme, std::size_t part) const
    {
        std::vector<double> tokens;
        for (std::size_t pi = 0; pi < scheme.maps.size(); ++pi) {
            const auto seq = std::size_t(m_result.promptTokens[pi]);
            const std::vector<float>& map = scheme.maps[pi][part];
            for (std::size_t t = 0; t < seq; ++t)
                if (const float v = map[std::size_t(m_l) * seq + t]; std::isfinite(v))
                    tokens.push_back(v);
        }
        return upperQuantileInPlace(tokens, 0.9);
    }

    // The layer's summary per scheme; its cells go (memory does not grow with the layers).
    void summarise()
    {
        for (std::size_t si = 0; si < m_schemes; ++si) {
            WhatIfLayer& out = m_result.schemes[si].layers[std::size_t(m_l)];
            out.layer = m_layer;
            for (int part = 0; part < 2; ++part) {
                out.relL2Median[part] = medianInPlace(m_w.relL2[part][si]);
                out.floorRatioMedian[part] = medianInPlace(m_w.ratio[part][si]);
                out.floorRatioP90[part] = tokenP90(m_result.schemes[si], std::size_t(part));
                for (std::size_t h = 0; h < m_w.headRelL2[part][si].size(); ++h)
                    if (const double m = medianInPlace(m_w.headRelL2[part][si][h]); m > out.worstHeadRelL2[part])
                        out.worstHeadRelL2[part] = m, out.worstHead[part] = int(h);
                out.saturated[part] = m_w.stats[part][si].values
                                          ? double(m_w.stats[part][si].saturated) / double(m_w.stats[part][si].values) : 0;
            }
            out.kOutlierChannel = m_w.kOutlier;
            out.worst = std::move(m_w.worst[si]);
            out.worst.shrink_to_fit();
            std::sort(out.worst.begin(), out.worst.end(),
                      [](const WhatIfCell& a, const WhatIfCell& b) { return a.floorRatio > b.floorRatio; });
        }
        for (auto* perPart : {&m_w.relL2, &m_w.ratio})
            for (auto& v : *perPart)
                v = {};
        for (auto& v : m_w.headRelL2)
            v = {};
    }

    const CaptureLoader& m_loader;
    const WhatIfOptions& m_options;
    WhatIfResult& m_result;
    const bool m_baseline;
    LayerWork& m_w;
    const int m_l;
    const std::string& m_layer;
    const std::size_t m_schemes, m_keep;
    std::array<float, 2> m_warmupAmax{0, 0};
    std::vector<double> m_channelAmax;
    std::vector<float> m_quantised;
};

// A scheme's typical errors over the layers and its verdict: the layers one of whose heads
// does more than twice as badly as the model's typical worst head.
void judgeScheme(WhatIfScheme& s)
{
    std::vector<double> typical, worstHeads;
    for (const WhatIfLayer& out : s.layers) {
        const double worse = std::max(out.floorRatioMedian[0], out.floorRatioMedian[1]);
        if (std::isfinite(worse))
            typical.push_back(worse);
        worstHeads.push_back(std::max(out.worstHeadRelL2[0], out.worstHeadRelL2[1]));
    }
    s.typicalRatio = medianInPlace(typical);
    s.typicalWorstHead = medianInPlace(worstHeads);
    std::vector<std::string> hurt;
    double within = 0, outlier = 0, saturated = 0, crushed = 0;
    int crushedHead = -1;
    std::vector<double> outliers;
    for (const WhatIfLayer& l : s.layers)
        outliers.push_back(l.kOutlierChannel);
    const double typicalOutlier = medianInPlace(outliers);
    for (WhatIfLayer& l : s.layers) {
        const double worse = std::max(l.floorRatioMedian[0], l.floorRatioMedian[1]);
        if (!std::isfinite(worse))
            continue;
        l.hurt = std::max(l.worstHeadRelL2[0], l.worstHeadRelL2[1]) > 2 * s.typicalWorstHead;
        if (l.hurt) {
            for (int part = 0; part < 2; ++part)
                if (l.worstHeadRelL2[part] > crushed)
                    crushed = l.worstHeadRelL2[part], crushedHead = l.worstHead[part];
            hurt.push_back(l.layer);
            outlier = std::max(outlier, l.kOutlierChannel);
            saturated = std::max({saturated, l.saturated[0], l.saturated[1]});
        } else {
            within = std::max(within, worse);
        }
    }
    std::string text = s.scheme.description() + ": within " + shortNumber(within, 2) + "x bf16 noise on every layer";
    if (!hurt.empty()) {
        std::string names;
        for (std::size_t i = 0; i < hurt.size(); ++i)
            names += (i ? (i + 1 == hurt.size() ? " and " : ", ") : "") + hurt[i];
        text += " but " + names + " (head " + std::to_string(crushedHead) + "'s error up to " + shortNumber(100 * crushed, 100 * crushed >= 100 ? 3 : 2) +
                "%, the model's typical " + shortNumber(100 * s.typicalWorstHead, 2) + "%";
        if (saturated > 0)
            text += "; saturates " + shortNumber(100 * saturated, 2) + "% of values";
        if (outlier > 2 * typicalOutlier)  // outlier channels beyond the model's usual
            text += "; K outlier channels up to " + shortNumber(outlier, 2) + "x the median channel";
        text += ")";
    }
    s.verdict = text;
}

}  // namespace

WhatIfResult runWhatIf(const CaptureLoader& loader, const WhatIfOptions& options)
{
    bool baseline = false;
    WhatIfResult result = startResult(loader, options, baseline);
    if (result.promptIds.empty())
        return result;
    const std::size_t layers = result.layers.size();
    std::vector<LayerWork> work(layers);
    std::atomic<int> done{0};
    std::mutex progressMutex;
    auto layerTask = [&](int l, int) {
        if (options.cancel && options.cancel->load())
            return;
        LayerPass(loader, options, result, baseline, work[std::size_t(l)], l).run();
        if (options.progress) {
            std::lock_guard lock(progressMutex);
            options.progress(++done, int(layers));
        }
    };
    if (options.team)
        options.team->run(int(layers), layerTask);
    else
        for (int l = 0; l < int(layers); ++l)
            layerTask(l, 0);

    std::vector<double> floors[2];
    for (LayerWork& w : work)
        for (int part = 0; part < 2; ++part)
            floors[part].insert(floors[part].end(), w.floors[part].begin(), w.floors[part].end());
    for (int part = 0; part < 2; ++part)
        result.bf16FloorMedian[part] = medianInPlace(floors[part]);
    for (WhatIfScheme& s : result.schemes)
        judgeScheme(s);
    return result;
}

}  // namespace kvscope
