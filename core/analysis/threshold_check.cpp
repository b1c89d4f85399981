#include "analysis/threshold_check.h"

#include "analysis/impact_summary.h"

#include "analysis/suspect.h"
#include "util/json_writer.h"

#include <cmath>
#include <stdexcept>

namespace kvscope {

namespace {

void addNonFinite(const PromptAnalysis& p, std::vector<Violation>& out)
{
    for (const NonFiniteCell& c : p.nonFinite)
        out.push_back({p.id, p.layers[std::size_t(c.layer)], c.token, c.head,
                       partName(p, c.part) + " input (" + c.side + ") holds NaN or infinity", std::nan(""), 0, {}});
}

// Each prompt's KL with the engine's KV in every layer (the record's `from` row of its first
// analysed layer), against maxKl.
void checkImpact(const PromptAnalysis& p, double maxKl, std::vector<Violation>& out)
{
    const std::string first = p.layers.empty() ? std::string() : p.layers.front();
    if (!p.impact) {
        out.push_back({p.id, first, -1, -1, "kl (no impact record)", std::nan(""), maxKl,
                       "the bundle holds no impact for this prompt: `python3 -m kvscope_capture impact BUNDLE --model M` "
                       "measures it (docs/bundle-format.md, \"Impact\")"});
        return;
    }
    std::optional<std::size_t> row = p.impact->find({TransplantKind::From, first, {}});
    for (std::size_t t = 0; !row && t < p.impact->transplants.size(); ++t)
        if (p.impact->transplants[t].kind == TransplantKind::From)
            row = t;  // (the record's first: writers list layers in model order)
    if (!row) {
        out.push_back({p.id, first, -1, -1, "kl (no impact record)", std::nan(""), maxKl,
                       "the impact record has no `from` row: the engine's KV in every layer was not measured"});
        return;
    }
    const std::optional<ImpactFigures> f = impactFigures({p}, {p.id}, p.impact->transplants[*row]);
    if (f->klMax <= maxKl)
        return;
    std::int64_t worst = 0;
    for (std::int64_t g = 0; g < p.impact->steps; ++g)
        if (p.impact->klAt(*row, g) > p.impact->klAt(*row, worst))
            worst = g;
    out.push_back({p.id, p.impact->transplants[*row].layer, p.promptLen + worst, -1,
                   "kl (the engine's KV from this layer on, nats)", f->klMax, maxKl,
                   "the reference model " + impactFiguresText(*f)});
}

}  // namespace

std::vector<Violation> checkThresholds(const AnalysisResult& result, const Thresholds& t)
{
    std::vector<Violation> out;
    // A sweep's bundle left out (unreadable, another model's) fails first: its prompts were not judged at all.
    for (const SweepBundle& b : result.bundles)
        if (!b.problem.empty())
            out.push_back({"", "", -1, -1, "bundle left out", std::nan(""), 0, b.problem, b.name});
    if (t.maxKl) {
        for (const PromptAnalysis& p : result.prompts) {
            addNonFinite(p, out);
            checkImpact(p, *t.maxKl, out);
        }
        return out;
    }
    // Any suspect fails, and comes first: something left the noise floor of its dtype.
    // Seen in several prompts: the prompt its evidence is about first, and no token (positions
    // differ from prompt to prompt; the evidence gives that prompt's).
    for (const Suspect& s : result.suspects) {
        std::string prompts = s.prompts.size() > 1 ? s.evidencePrompt : "";
        for (const std::string& id : s.prompts)
            if (s.prompts.size() == 1 || id != s.evidencePrompt)
                prompts += (prompts.empty() ? "" : ",") + id;
        out.push_back({prompts, s.firstLayer, s.prompts.size() > 1 ? -1 : s.firstToken,
                       s.heads.size() == 1 ? s.heads.front() : -1,
                       std::string("suspect: ") + suspectPatternName(s.pattern) +
                           (s.pattern == SuspectPattern::NonFinite ? " (NaN or infinity, off whatever the floor)"
                                                                    : " (score, in noise floors)"),
                       s.score,
                       t.suspects.offFloor, s.evidence});
    }
    // Replicas that differ fail too: a rank's copy went wrong where the analysed copy cannot show it.
    for (const PromptAnalysis& p : result.prompts)
        for (const ReplicaDifference& d : p.replicaDifferences)
            out.push_back({p.id, d.layer, d.firstPosition, -1, "replica differs (differing blocks)", double(d.blocks), 0,
                           d.describe()});
    for (const PromptAnalysis& p : result.prompts) {
        for (int l = 0; l < int(p.layers.size()); ++l) {
            const std::string& layer = p.layers[std::size_t(l)];
            for (KvPart part : {KvPart::K, KvPart::V}) {
                const Metric linf = metricFor(part, MetricKind::Linf);
                const Extreme actual = layerMax(p, linf, l);
                if (p.threeWay) {
                    const Extreme base = layerMax(p, baseOf(linf), l);
                    // A quantised cache: expected as the cache stores it (analysis_result.h).
                    double floor = base.value;
                    for (std::int64_t t = 0; t < p.tokens; ++t)
                        if (const float q = p.quantFloor(part, MetricKind::Linf, l, t); q > floor)
                            floor = q;
                    if (actual.head >= 0 && base.head >= 0) {
                        const double ratio = double(actual.value) / std::max(floor, 1e-10);
                        if (ratio > t.maxRatio)
                            out.push_back({p.id, layer, actual.token, p.heads > 1 ? actual.head : -1,
                                           partName(p, part) + "_linf multiplier (actual/expected)", ratio,
                                           t.maxRatio, {}});
                    }
                }
                if (t.maxLinf && actual.head >= 0 && actual.value > *t.maxLinf)
                    out.push_back({p.id, layer, actual.token, p.heads > 1 ? actual.head : -1, metricName(linf), actual.value,
                                   *t.maxLinf, {}});
            }
            p.releaseLayer(l);
        }
        addNonFinite(p, out);
    }
    if (result.aggregate) {
        const AggregateBc& a = *result.aggregate;
        for (std::size_t l = 0; l < a.layers.size(); ++l)
            for (KvPart part : {KvPart::K, KvPart::V}) {
                const float bc = (t.bcVsNoise ? a.combinedVsNoise : a.combined)[std::size_t(part)][l];
                if (!std::isnan(bc) && bc < t.minBc)
                    out.push_back({"", a.layers[l], -1, -1,
                                   "combined " + (result.prompts.empty() ? std::string(kvPartName(part)) : partName(result.prompts.front(), part)) +
                                       (t.bcVsNoise ? "_bc_vs_noise" : "_bc"),
                                   bc,
                                   t.minBc, {}});
            }
    }
    return out;
}

AnalysisResult analyzeForVerdict(const std::shared_ptr<BundleReader>& reader, AnalysisOptions options)
{
    options.unreadableBlocks = UnreadableBlockPolicy::Error;
    AnalysisResult result = analyzeBundle(reader, options);
    requireNoProblems(result);
    return result;
}

AnalysisResult analyzeForVerdict(const Sweep& sweep, const AnalysisOptions& options)
{
    AnalysisResult result = analyzeSweep(sweep, options);
    requireNoProblems(result);
    return result;
}

void requireNoProblems(const AnalysisResult& result)
{
    if (!result.problems.empty())
        throw std::runtime_error(result.problems.front());
    for (const PromptAnalysis& p : result.prompts)
        if (!p.problems.empty())
            throw std::runtime_error(p.problems.front());
}

void writeVerdictJson(const std::string& bundle, const Thresholds& t, const std::vector<Violation>& violations,
                      std::ostream& out)
{
    JsonWriter w(out);
    w.beginObject()
        .field("bundle", bundle)
        .key("thresholds")
        .beginObject()
        .field("min_bc", t.minBc)
        .field("bc", t.bcVsNoise ? "bc_vs_noise" : "bc")
        .field("max_ratio", t.maxRatio)
        .field("max_linf", t.maxLinf)
        .field("max_kl", t.maxKl)
        .endObject()
        .field("passed", violations.empty())
        .key("violations")
        .array(violations.size(), [&](std::size_t i) {
            const Violation& v = violations[i];
            w.beginObject().key("prompt");
            if (v.prompt.empty())
                w.null();
            else
                w.value(v.prompt);
            w.field("layer", v.layer).key("token");
            if (v.token >= 0)
                w.value(v.token);
            else
                w.null();
            w.key("head");
            if (v.head >= 0)
                w.value(v.head);
            else
                w.null();
            w.field("metric", v.metric).field("value", v.value).field("threshold", v.threshold);
            if (!v.detail.empty())
                w.field("evidence", v.detail);
            if (!v.bundle.empty())
                w.field("bundle", v.bundle);
            w.endObject();
        })
        .endObject();
    out << '\n';
}

}  // namespace kvscope
