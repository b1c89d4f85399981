#include "diff/capture_diff.h"

#include "analysis/off_floor.h"
#include "analysis/structural_evidence.h"
#include "analysis/suspect_search.h"
#include "kv/capture_loader.h"
#include "kv/prompt_match.h"
#include "util/content_hash.h"

#include <algorithm>
#include <cmath>
#include <tuple>

namespace kvscope {

namespace {

// What run-to-run noise keeps a layer's median below, in floors (three-way): the level up to
// which the suspects call an error explained (SuspectThresholds::explained). A p99 of few cells
// is their max: it gets the max's threshold.
constexpr double kNoiseStatFloors = 2.0;
constexpr std::size_t kWorstMoves = 20;

// The statistic of `values` (reordered); NaN for none. Order statistics as median.h takes them
// (the upper one, no averaging).
float statistic(std::vector<float>& values, DiffStat stat)
{
    if (values.empty())
        return std::nanf("");
    std::size_t rank = values.size() - 1;
    if (stat == DiffStat::Median)
        rank = values.size() / 2;
    else if (stat == DiffStat::P99)
        rank = std::min(values.size() - 1, std::size_t(std::ceil(0.99 * double(values.size()))) - 1);
    std::nth_element(values.begin(), values.begin() + std::ptrdiff_t(rank), values.end());
    return values[rank];
}

// Where `name` is in `names`, or -1.
int indexOf(const std::vector<std::string>& names, const std::string& name)
{
    const auto found = std::find(names.begin(), names.end(), name);
    return found == names.end() ? -1 : int(found - names.begin());
}

// A and B must have compared against the same reference, in the same floors.
void checkComparable(const DiffPrompt& a, const DiffPrompt& b, const std::string& pathA, const std::string& pathB)
{
    const std::string names = "prompt " + a.id + " of " + pathA + " and prompt " + b.id + " of " + pathB;
    if (a.threeWay != b.threeWay)
        throw DiffMismatch(names + " have the same tokens but one is three-way and the other two-way: their ratios are in "
                                   "different floors (give both a baseline, or neither)");
    if (a.tokens != b.tokens)
        throw DiffMismatch(names + " have the same tokens but " + std::to_string(a.tokens) + " and " +
                           std::to_string(b.tokens) + " positions");
    // Layer by layer, over the layers both analysed (either may be a subset: --layers).
    for (std::size_t lb = 0; lb < b.layers.size(); ++lb) {
        const int found = indexOf(a.layers, b.layers[lb]);
        if (found < 0)
            continue;
        const std::size_t la = std::size_t(found);
        for (std::size_t role = 0; role < (a.threeWay ? 2u : 1u); ++role)
            if (a.referenceHashes[role][la] != b.referenceHashes[role][lb])
                throw DiffMismatch(names + " were compared against different " + (role ? "baselines" : "expected references") +
                                   " at " + b.layers[lb] + " (fingerprints " + hexFingerprint(a.referenceHashes[role][la]) +
                                   " and " + hexFingerprint(b.referenceHashes[role][lb]) + ")");
    }
}

// A's ratios laid over B's layers (NaN where A lacks the layer).
CellRatioMaxima alignedRatios(const DiffPrompt& a, const DiffPrompt& b)
{
    CellRatioMaxima out;
    for (std::size_t part = 0; part < 2; ++part) {
        out[part].assign(b.layers.size() * std::size_t(b.tokens), std::nanf(""));
        for (std::size_t lb = 0; lb < b.layers.size(); ++lb) {
            const int la = indexOf(a.layers, b.layers[lb]);
            if (la < 0)
                continue;
            std::copy_n(a.ratios[part].begin() + std::ptrdiff_t(std::size_t(la) * std::size_t(a.tokens)), std::size_t(b.tokens),
                        out[part].begin() + std::ptrdiff_t(lb * std::size_t(b.tokens)));
        }
    }
    return out;
}

}  // namespace

const char* diffStatName(DiffStat stat)
{
    switch (stat) {
    case DiffStat::Max: return "max";
    case DiffStat::P99: return "p99";
    case DiffStat::Median: return "median";
    }
    return "?";
}

bool parseDiffStat(const std::string& name, DiffStat& stat)
{
    for (DiffStat s : {DiffStat::Max, DiffStat::P99, DiffStat::Median})
        if (name == diffStatName(s)) {
            stat = s;
            return true;
        }
    return false;
}

const char* changeName(Change change)
{
    switch (change) {
    case Change::Same: return "same";
    case Change::Worse: return "worse";
    case Change::Better: return "better";
    }
    return "?";
}

Change LayerDiff::verdict() const
{
    if (change[0] == Change::Worse || change[1] == Change::Worse)
        return Change::Worse;
    if (change[0] == Change::Better || change[1] == Change::Better)
        return Change::Better;
    return Change::Same;
}

int DiffResult::count(Change change) const
{
    return int(std::count_if(layers.begin(), layers.end(), [&](const LayerDiff& l) { return l.verdict() == change; }));
}

namespace {

// Prompts matched by their tokens (kv/prompt_match.h), in B's order, each A prompt used once:
// (A, B) index pairs; the unmatched named in `result`.
std::vector<std::pair<std::size_t, std::size_t>> matchPrompts(const DiffSide& a, const DiffSide& sideB,
                                                              const AnalysisResult& b, DiffResult& result)
{
    std::vector<const std::vector<std::int64_t>*> tokensA, tokensB;
    for (const DiffPrompt& p : a.prompts)
        tokensA.push_back(&p.inputIds);
    for (const DiffPrompt& p : sideB.prompts)
        tokensB.push_back(&p.inputIds);
    const PromptMatch match = matchPromptsByTokens(tokensA, tokensB);
    for (const auto& [ia, ib] : match.pairs) {
        checkComparable(a.prompts[ia], sideB.prompts[ib], a.path, b.bundle);
        result.matched.emplace_back(a.prompts[ia].id, sideB.prompts[ib].id);
    }
    for (std::size_t ib : match.onlyB)
        result.onlyB.push_back(sideB.prompts[ib].id);
    for (std::size_t ia : match.onlyA)
        result.onlyA.push_back(a.prompts[ia].id);
    if (match.pairs.empty()) {
        std::string what = "no prompt of " + b.bundle + " has the tokens of a prompt of " + a.path;
        if (!sideB.prompts.empty() && !a.prompts.empty())
            what += " (B's " + sideB.prompts.front().id + ": " + describeTokenIds(sideB.prompts.front().inputIds) +
                    "; A's " + a.prompts.front().id + ": " + describeTokenIds(a.prompts.front().inputIds) + ")";
        throw DiffMismatch(what + ": they are captures of different prompts");
    }
    return match.pairs;
}

// What every layer of the diff reads: the matched prompts, A's ratios aligned on B's cells, and
// B's off-floor thresholds.
struct MatchedCells {
    const DiffSide& sideB;
    const std::vector<std::pair<std::size_t, std::size_t>>& pairs;
    const std::vector<CellRatioMaxima>& aligned;
    const std::vector<std::vector<double>>& thresholds;
    const DiffOptions& options;
    bool threeWay;
};

// One of B's layers: each part's cells of every matched prompt, A's and B's ratios, the cells
// that moved past B's off-floor threshold, the statistic and its verdict.
LayerDiff diffLayer(const MatchedCells& in, std::size_t lb, const std::string& name, std::vector<CellMove>& worse)
{
    LayerDiff layer;
    layer.name = name;
    layer.layer = int(lb);
    for (KvPart part : {KvPart::K, KvPart::V}) {
        const std::size_t pi = std::size_t(part);
        std::vector<float> valuesA, valuesB;
        double noise = 0;
        for (std::size_t m = 0; m < in.pairs.size(); ++m) {
            const DiffPrompt& pb = in.sideB.prompts[in.pairs[m].second];
            const double threshold = in.thresholds[m][lb];
            noise = std::max(noise, threshold);
            for (std::int64_t t = 0; t < pb.tokens; ++t) {
                const std::size_t at = lb * std::size_t(pb.tokens) + std::size_t(t);
                const float ra = in.aligned[m][pi][at], rb = pb.ratios[pi][at];
                if (!std::isfinite(ra) || !std::isfinite(rb))
                    continue;
                valuesA.push_back(ra);
                valuesB.push_back(rb);
                if (rb > threshold && double(rb) > in.options.maxWorse * double(ra)) {
                    ++layer.worseCells[pi];
                    const CellMove move{pb.id, int(lb), t, part, ra, rb};
                    worse.push_back(move);
                    if (!layer.firstWorse || t < layer.firstWorse->token)
                        layer.firstWorse = move;
                } else if (ra > threshold && double(ra) > in.options.maxWorse * double(rb)) {
                    ++layer.betterCells[pi];
                }
            }
        }
        layer.cells[pi] = std::int64_t(valuesA.size());
        layer.statA[pi] = statistic(valuesA, in.options.stat);
        layer.statB[pi] = statistic(valuesB, in.options.stat);
        layer.noise[pi] = in.options.stat == DiffStat::Median && in.threeWay ? kNoiseStatFloors : noise;
        const double sa = layer.statA[pi], sb = layer.statB[pi];
        if (sb > layer.noise[pi] && sb > in.options.maxWorse * sa)
            layer.change[pi] = Change::Worse;
        else if (sa > layer.noise[pi] && sa > in.options.maxWorse * sb)
            layer.change[pi] = Change::Better;
    }
    return layer;
}

}  // namespace

DiffResult diffAnalyses(const DiffSide& a, const AnalysisResult& b, const CaptureLoader& loaderB, const DiffOptions& options)
{
    DiffResult result;
    result.pathA = a.path;
    result.pathB = b.bundle;
    result.aFromAnalysisJson = a.fromAnalysisJson;
    result.options = options;
    const DiffSide sideB = diffSideOf(b);
    const std::vector<std::pair<std::size_t, std::size_t>> pairs = matchPrompts(a, sideB, b, result);

    const DiffPrompt& firstB = sideB.prompts[pairs.front().second];
    result.threeWay = firstB.threeWay;
    result.referenceFromA = loaderB.metadata().engineOnly;
    result.layerNamesB = firstB.layers;
    result.partNames = b.prompts[pairs.front().second].partNames;
    const std::vector<std::string>& layersA = a.prompts[pairs.front().first].layers;
    std::vector<char> inA(firstB.layers.size(), 0);
    for (std::size_t lb = 0; lb < firstB.layers.size(); ++lb) {
        inA[lb] = indexOf(layersA, firstB.layers[lb]) >= 0;
        if (!inA[lb])
            result.layersOnlyB.push_back(firstB.layers[lb]);
    }
    for (const std::string& name : layersA)
        if (indexOf(firstB.layers, name) < 0)
            result.layersOnlyA.push_back(name);

    // Per matched prompt: A over B's layers, and B's off-floor thresholds.
    std::vector<CellRatioMaxima> aligned;
    std::vector<std::vector<double>> thresholds;
    for (const auto& [ia, ib] : pairs) {
        aligned.push_back(alignedRatios(a.prompts[ia], sideB.prompts[ib]));
        thresholds.push_back(findOffFloor(b.prompts[ib], options.suspects).threshold);
    }
    std::vector<CellMove> worse;
    const MatchedCells inputs{sideB, pairs, aligned, thresholds, options, result.threeWay};
    for (std::size_t lb = 0; lb < firstB.layers.size(); ++lb)
        if (inA[lb])
            result.layers.push_back(diffLayer(inputs, lb, firstB.layers[lb], worse));

    for (const LayerDiff& layer : result.layers)
        if (layer.verdict() == Change::Worse) {
            result.firstWorse = layer.firstWorse;
            if (!result.firstWorse)
                result.firstWorse = CellMove{{}, layer.layer, -1, KvPart::K, 0, 0};  // a broad shift, no cell beyond noise
            break;
        }
    std::sort(worse.begin(), worse.end(), [](const CellMove& x, const CellMove& y) {
        return std::make_tuple(-x.b, x.layer, x.token, int(x.part)) < std::make_tuple(-y.b, y.layer, y.token, int(y.part));
    });
    worse.resize(std::min(worse.size(), kWorstMoves));
    result.worstMoves = std::move(worse);

    for (std::size_t m = 0; m < pairs.size(); ++m) {
        const DiffPrompt& pb = sideB.prompts[pairs[m].second];
        result.maps.push_back({a.prompts[pairs[m].first].id, pb.id, pb.tokens, aligned[m], pb.ratios});
    }

    // The suspects of the change: B's, among the cells that got worse.
    std::vector<std::vector<Suspect>> perPrompt;
    for (std::size_t m = 0; m < pairs.size(); ++m) {
        const EarlierRun earlier{&aligned[m], options.maxWorse};
        perPrompt.push_back(findSuspects(loaderB, b.prompts[pairs[m].second], options.suspects, nullptr, nullptr, &earlier));
    }
    result.suspects = poolSuspects(perPrompt);
    // The structure the change's off positions follow across B's matched prompts, as analyze
    // says it (a chunk boundary is each prompt's suspect's own already).
    std::vector<PromptSuspects> changed;
    for (std::size_t m = 0; m < pairs.size(); ++m)
        changed.push_back({&b.prompts[pairs[m].second], &perPrompt[m]});
    addStructuralEvidence(result.suspects, changed, loaderB.config());
    return result;
}

}  // namespace kvscope
