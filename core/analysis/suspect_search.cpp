#include "analysis/suspect_search.h"

#include "analysis/error_shape.h"
#include "analysis/hypotheses.h"
#include "analysis/map_spec.h"
#include "analysis/off_floor.h"
#include "analysis/page_rereads.h"
#include "analysis/structural_evidence.h"
#include "analysis/suspect_patterns.h"
#include "analysis/whose_kv.h"
#include "format/rope_settings.h"
#include "kv/capture_loader.h"

#include <algorithm>
#include <limits>
#include <map>
#include <set>
#include <tuple>
#include <iomanip>
#include <optional>
#include <sstream>

namespace kvscope {

const char* suspectPatternName(SuspectPattern pattern)
{
    switch (pattern) {
    case SuspectPattern::Block: return "block";
    case SuspectPattern::TpRank: return "tp_rank";
    case SuspectPattern::Head: return "head";
    case SuspectPattern::Position: return "position";
    case SuspectPattern::WindowEdge: return "window_edge";
    case SuspectPattern::Layer: return "layer";
    case SuspectPattern::Unexplained: return "unexplained";
    case SuspectPattern::NonFinite: return "non_finite";
    case SuspectPattern::State: return "state";
    }
    return "?";
}

namespace {

std::string joinInts(const std::vector<int>& v)
{
    std::string s;
    for (std::size_t i = 0; i < v.size(); ++i)
        s += (i ? ", " : "") + std::to_string(v[i]);
    return s;
}

std::string layerList(const std::vector<std::string>& layers, std::size_t from)
{
    std::string s;
    for (std::size_t i = from; i < layers.size(); ++i) {
        if (i - from == 4 && layers.size() - from > 5) {
            s += ", ... " + shortLayerName(layers.back());
            break;
        }
        s += (i > from ? ", " : "") + shortLayerName(layers[i]);
    }
    return s;
}

// Logical and physical blocks of `group` behind tokens [first, last] (at most `cap`).
std::vector<SuspectBlock> blocksOf(const CaptureLoader& loader, const PromptInfo& info, int group, std::int64_t first,
                                   std::int64_t last, std::size_t cap = 16)
{
    std::vector<SuspectBlock> out;
    const std::int64_t blockSize = loader.config().positionsPerEntry(loader.config().groups[std::size_t(group)]);
    std::map<std::size_t, BlockTable> tables;  // per snapshot
    for (std::int64_t logical = first / blockSize; logical <= last / blockSize && out.size() < cap; ++logical) {
        const std::int64_t token = std::max(first, logical * blockSize);
        // The snapshot that wrote this position (snapshot_merge.h).
        std::size_t s = 0;
        while (s + 1 < info.snapshots.size() && token >= info.snapshots[s].validatedUntil)
            ++s;
        SuspectBlock b{group, logical, -1};
        try {
            auto it = tables.find(s);
            if (it == tables.end())
                it = tables.emplace(s, loader.blockTable(info.id, s, std::size_t(group))).first;
            const BlockTable& t = it->second;
            const std::int64_t row = info.snapshots[s].batchRow;
            if (row < t.rows && logical < t.cols)
                b.physical = t.at(row, logical);
        } catch (const std::exception&) {
            // Unreadable table: the logical block is still worth naming.
        }
        out.push_back(b);
    }
    return out;
}

// The onset's tokens, phase and part from the suspect's own heads: stray noise cells in other
// heads say nothing about it (at long contexts a clean cell above the threshold is expected).
void narrowToOwnHeads(const PromptAnalysis& p, const Onset& onset, Suspect& s)
{
    if (!onset.allHeads && !s.heads.empty()) {
        std::int64_t first = p.tokens, last = -1;
        int k = 0, v = 0;
        for (const OffCell& c : onset.cells())
            if (std::find(s.heads.begin(), s.heads.end(), c.head) != s.heads.end()) {
                first = std::min(first, c.token);
                last = std::max(last, c.token);
                (c.part == KvPart::K ? k : v)++;
            }
        s.firstToken = first;
        s.lastToken = last;
        s.phase = phaseOf(first, last, p.promptLen);
        s.kv = partsOf(k, v);
    }
}

// The suspect's own tokens (narrowToOwnHeads), the TP ranks that hold them, and the blocks
// behind its tokens.
void attribute(const CaptureLoader& loader, const PromptAnalysis& p, const Onset& onset, Suspect& s)
{
    narrowToOwnHeads(p, onset, s);
    if (s.dcpRanks.empty()) {  // the DCP ranks of the suspect's own off positions
        std::set<std::int64_t> tokens;
        for (const OffCell& c : onset.cells())
            if (std::find(s.heads.begin(), s.heads.end(), c.head) != s.heads.end())
                tokens.insert(c.token);
        s.dcpRanks = dcpRanksOf(onset.config, onset.group, tokens);
    }
    const auto holdsShare = [&](int r) {
        return s.dcpRanks.empty() ||
               std::find(s.dcpRanks.begin(), s.dcpRanks.end(), onset.config.dcpRankOf(r)) != s.dcpRanks.end();
    };
    const TpLayout layout = onset.config.layout(onset.config.groups[std::size_t(onset.group)]);
    if (s.tpRanks.empty())
        for (int h : s.heads)
            for (int r : layout.ranksHolding(h))
                if (holdsShare(r) && std::find(s.tpRanks.begin(), s.tpRanks.end(), r) == s.tpRanks.end())
                    s.tpRanks.push_back(r);
    std::sort(s.tpRanks.begin(), s.tpRanks.end());
    if (s.blocks.empty())
        s.blocks = blocksOf(loader, loader.prompt(p.id), onset.group, s.firstToken, s.lastToken);
}

// The onset layer's vectors the hypotheses read (hypotheses.h), kept for measuring what an
// unexplained error looks like (error_shape.h); `read` false when the layer could not be read again.
struct OnsetVectors {
    SampledLayer engine, reference;
    std::optional<RopeSettings> rope;
    bool read = false;
};

// The onset layer's engine and reference KV, tested against every hypothesis (hypotheses.h);
// none when the layer cannot be read again.
std::vector<Hypothesis> explain(const CaptureLoader& loader, const PromptAnalysis& p, const OffFloor& floor,
                                const Onset& onset, double explainedBound, OnsetVectors& vectors)
{
    try {
        const std::string& layer = p.layers[std::size_t(onset.layer)];
        const int heads = p.headsOf(onset.layer);
        // Only the positions the hypotheses look at, a window of tokens at a time: a long layer
        // is not read whole (1 GB a side at 131,072 tokens of a 70B model).
        const HypothesisPositions positions = hypothesisPositions(p, loader.config(), onset.layer, onset.cells(), p.tokens, heads);
        const ReferenceRole role = p.threeWay ? ReferenceRole::Baseline : ReferenceRole::Expected;
        constexpr std::int64_t kExplainWindow = 4096;
        // An older bundle's reference row is one chunk: each window would read it whole again.
        const std::int64_t referenceWindow =
            loader.referencePositionsPerChunk(p.id, role, layer) > kExplainWindow ? p.tokens : kExplainWindow;
        vectors.engine = SampledLayer::read(positions.engine, p.tokens, kExplainWindow, [&](PositionRange window) {
            return loader.engineSource(p.id, layer, nullptr, window);
        });
        vectors.reference = SampledLayer::read(positions.reference, p.tokens, referenceWindow, [&](PositionRange window) {
            return loader.referenceSource(p.id, role, layer, window);
        });
        const SampledLayer& engine = vectors.engine;
        const SampledLayer& reference = vectors.reference;
        if (engine.heads != heads || reference.heads != heads || engine.seq != p.tokens || reference.seq != p.tokens)
            return {};
        vectors.rope = ropeSettingsOf(loader.metadata(), loader.path());
        vectors.read = true;
        const HypothesisInput input{p, loader.config(), floor.ratios, onset.layer, onset.cells(), engine, reference,
                                    vectors.rope, explainedBound, &loader.prompt(p.id).snapshots};
        return testHypotheses(input);
    } catch (const std::exception&) {
        vectors.read = false;
        return {};  // the analysis read it once; a second read failing leaves the suspect unexplained
    }
}

// Whether the engine's vectors at the off cells are unrelated to the reference's at the same
// place (median cosine under a half), not a perturbation of them.
bool uncorrelated(const PromptAnalysis& p, const Onset& onset)
{
    std::vector<double> cosines;
    for (const OffCell& c : onset.cells())
        cosines.push_back(double(p.value(metricFor(c.part, MetricKind::Cos), onset.layer, c.token, c.head)));
    return median(cosines) < 0.5;
}

std::string floorsText(double x)
{
    std::ostringstream out;
    out << std::setprecision(x < 10 ? 2 : 3) << x;
    return out.str();
}

}  // namespace

namespace {

// The zeros a window mismatch leaves, as that hypothesis: its residual is the zeros'.
Hypothesis windowMismatchHypothesis(const WindowMismatch& m, const Hypothesis& zeros)
{
    Hypothesis h = zeros;
    h.kind = "window_mismatch";
    h.parameters = {{"kept", double(m.kept)}, {"reference_kept", double(m.referenceKept)}, {"window", double(m.window)},
                    {"layers", double(m.layers.size())}, {"sliding", m.sliding ? 1.0 : 0.0}};
    std::ostringstream text;
    if (m.sliding)
        text << "the sliding layers keep " << m.kept << " position(s) where the reference keeps " << m.referenceKept
             << (m.window ? " (window " + std::to_string(m.window) + ")" : std::string()) << ": the older ones are zero, a window off by "
             << m.referenceKept - m.kept;
    else
        text << "the full layers keep only the last " << m.kept << " position(s)"
             << (m.window ? ", as the model's sliding window of " + std::to_string(m.window) + " would" : std::string())
             << ": the older ones are zero (a window applied to full-attention layers)";
    h.text = text.str();
    return h;
}

// How far the hypotheses go: `explained` whole, or in `partly` (a share of the off cells).
struct Explanation {
    std::vector<Hypothesis> hypotheses;
    double bound = 0;
    bool explained = false, partly = false;
};

// The explanation: the best hypothesis, if it brings the error back near the floor and clearly
// lowers it (s.hypothesis). Unexplained: the nearest one that clearly lowers it, if any, and
// what the error looks like (s.measured).
Explanation explainSuspect(const CaptureLoader& loader, const PromptAnalysis& p, const SuspectThresholds& th,
                           const OffFloor& floor, const Onset& onset, Suspect& s)
{
    const int L0 = onset.layer;
    const double clean = cleanLevel(floor, p, L0);
    const double explainedBound = th.explained * clean;
    OnsetVectors vectors;
    const auto leads = [&](const Hypothesis& h) { return clearlyLowers(h, clean); };
    std::vector<Hypothesis> hypotheses = explain(loader, p, floor, onset, explainedBound, vectors);
    bool explained = !hypotheses.empty() && hypotheses.front().residualFloors <= explainedBound && leads(hypotheses.front());
    // Right data read from the wrong place of the engine's own cache (page_rereads.h): a read
    // rank holding another head while its replica holds the right one (more specific than the
    // head map it looks like), or, when nothing explains, the cache's page order exchanged.
    if (vectors.read) {
        const HypothesisInput input{p, loader.config(), floor.ratios, L0, onset.cells(), vectors.engine,
                                    vectors.reference, vectors.rope, explainedBound};
        std::optional<Hypothesis> reread;
        try {
            reread = readRankHeadHypothesis(loader, input, p.replicaDifferences);
            if (!reread && !explained)
                reread = cacheOrderHypothesis(loader, input);
        } catch (const std::exception&) {
            reread.reset();  // the pages could not be read again: the hypotheses above stand
        }
        if (reread && leads(*reread)) {
            hypotheses.insert(hypotheses.begin(), *reread);
            explained = true;
        }
    }
    // Nothing at its own place explains it: whose KV is it (another layer's, another prompt's)?
    if (!explained && vectors.read) {
        const HypothesisInput input{p, loader.config(), floor.ratios, L0, onset.cells(), vectors.engine,
                                    vectors.reference, vectors.rope, explainedBound};
        const std::optional<Hypothesis> whose =
            whoseKv({loader, input, p.threeWay ? ReferenceRole::Baseline : ReferenceRole::Expected});
        if (whose && leads(*whose)) {
            hypotheses.insert(hypotheses.begin(), *whose);
            explained = true;
        }
    }
    s.tried = hypotheses;
    if (explained)
        s.hypothesis = hypotheses.front();
    // Or in part: one that brings back at least 40% of the off cells (a table shifted by a block
    // whose last entry holds garbage), the share said in the text.
    bool partly = false;
    if (!explained) {
        const Hypothesis* most = nullptr;
        for (const Hypothesis& h : hypotheses)
            if (h.kind != "unrelated" && (!most || h.explainedShare > most->explainedShare))
                most = &h;
        if (most && most->explainedShare >= 0.4) {
            s.hypothesis = *most;
            explained = partly = true;
        }
    }
    // Or whole token rows (every head, K and V) unrelated to any reference vector of the layer:
    // stale data, or another sequence's.
    const auto unrelated = std::find_if(hypotheses.begin(), hypotheses.end(),
                                        [](const Hypothesis& h) { return h.kind == "unrelated"; });
    if (!explained && unrelated != hypotheses.end() && onset.allHeads && onset.kv == "kv" && uncorrelated(p, onset)) {
        s.hypothesis = *unrelated;
        explained = true;
    }
    if (!explained) {
        // The nearest that leads; `unrelated` says nothing is near, which leads nowhere.
        const auto nearest = std::find_if(hypotheses.begin(), hypotheses.end(),
                                          [&](const Hypothesis& h) { return h.kind != "unrelated" && leads(h); });
        if (nearest != hypotheses.end())
            s.hypothesis = *nearest;
        if (vectors.read) {
            const HypothesisInput input{p, loader.config(), floor.ratios, L0, onset.cells(), vectors.engine,
                                        vectors.reference, vectors.rope, explainedBound};
            s.measured = measureErrorShape(input, clean);
        }
    }
    // Zeros whose positions are a window's edge in the wrong place: the window mismatch it is.
    if (explained && !partly && s.hypothesis.kind == "zeros")
        if (const std::optional<WindowMismatch> m = windowMismatchOf(onset, loader.prompt(p.id).snapshots)) {
            s.hypothesis = windowMismatchHypothesis(*m, s.hypothesis);
            s.tried.insert(s.tried.begin(), s.hypothesis);
        }
    return {s.tried, explainedBound, explained, partly};
}

// The places an explaining `kind` names: the keys "<prefix>i" of its parameters whose value is
// not i (a head or rank holding another's data), sorted; empty for another kind.
std::vector<int> mappedBy(const Hypothesis& h, const char* kind, const std::string& prefix)
{
    std::vector<int> out;
    if (h.kind != kind)
        return out;
    for (const auto& [name, value] : h.parameters)
        if (name.rfind(prefix, 0) == 0 && name.size() > prefix.size()) {
            const int from = std::atoi(name.c_str() + prefix.size());
            if (value != double(from))
                out.push_back(from);
        }
    std::sort(out.begin(), out.end());
    return out;
}

// The place: each pattern's defining property, from the most specific (s.pattern and what it
// names); the sentence that says it.
std::string placeSuspect(const CaptureLoader& loader, const PromptAnalysis& p, const OffFloor& floor, const Onset& onset,
                         bool explained, Suspect& s)
{
    const KvCacheConfig& config = loader.config();
    const int L0 = onset.layer;
    const std::string layer = shortLayerName(s.firstLayer);
    const auto spread = [&] {
        return floor.affected.size() > 1 ? "; later layers follow (" + layerList(s.layers, 1) + ")" : std::string();
    };
    const std::string kTitle = partTitle(p, KvPart::K), vTitle = partTitle(p, KvPart::V);
    const std::string kvText = s.kv == "kv" ? kTitle + " and " + vTitle : s.kv == "k" ? kTitle : vTitle;
    const std::string kvVerb = s.kv == "kv" ? " are" : " is";
    // " of every head", " of heads 1, 2", or nothing where a layer has one (an MLA latent).
    const std::string ofHeads = p.headsOf(L0) == 1 ? "" : onset.allHeads ? " of every head"
                                : onset.heads.size() == 1 ? " of head " + joinInts(onset.heads)
                                                          : " of heads " + joinInts(onset.heads);
    const std::vector<int> ranks = ranksOfHeads(onset);
    const std::vector<int> dcpShare = dcpShareOf(onset);
    // An explaining hypothesis that names the place decides it: a head map names heads, a
    // shard map ranks, whatever else the off cells happen to line up with.
    const std::vector<int> mappedHeads = explained ? mappedBy(s.hypothesis, "head_swap", "head_") : std::vector<int>{};
    const std::vector<int> mappedRanks = explained ? mappedBy(s.hypothesis, "rank_swap", "rank_") : std::vector<int>{};
    const int window = windowEdgeOf(onset);
    std::ostringstream why;
    if (looksLikeBlock(onset) && explained) {
        s.pattern = SuspectPattern::Block;
        const std::set<std::int64_t> rows = rowTokens(onset);
        s.firstToken = *rows.begin();
        s.lastToken = *rows.rbegin();
        s.phase = phaseOf(s.firstToken, s.lastToken, p.promptLen);
        s.blocks = blocksOf(loader, loader.prompt(p.id), onset.group, s.firstToken, s.lastToken);
        std::vector<int> logical, physical;
        for (const SuspectBlock& b : s.blocks)
            logical.push_back(int(b.logical)), physical.push_back(int(b.physical));
        why << kvText << (p.headsOf(L0) == 1 ? "" : " of every head") << kvVerb << " off the noise floor only at positions " << s.firstToken << "-"
            << s.lastToken << ", group " << onset.group << "'s logical block(s) " << joinInts(logical) << " (physical "
            << joinInts(physical) << "), in " << s.layers.size() << " layer(s) of that group and in no other layer";
    } else if (explained && s.hypothesis.kind == "window_mismatch") {
        s.pattern = SuspectPattern::WindowEdge;
        const char* type = s.hypothesis.parameter("sliding") == 1 ? "sliding" : "full";
        const char* other = s.hypothesis.parameter("sliding") == 1 ? "full" : "sliding";
        why << kvText << ofHeads << " of " << layer << kvVerb << " off the noise floor at "
            << (s.firstToken == s.lastToken ? "position " + std::to_string(s.firstToken)
                                            : "positions " + std::to_string(s.firstToken) + "-" + std::to_string(s.lastToken))
            << ", each more than " << s.hypothesis.parameter("kept") << " back from the sequence's end when read; so are those of all "
            << s.hypothesis.parameter("layers") << " " << type << " layers, and none of the " << other << " ones: a window's edge";
    } else if (!explained && window > 0) {
        s.pattern = SuspectPattern::WindowEdge;
        why << "The error starts at token " << s.firstToken << ", where the sequence first fills the sliding window of "
            << window << ", and stays to the end, in " << layer << ": the window's edge is off" << spread();
    } else if (!explained) {
        s.pattern = SuspectPattern::Unexplained;
        why << kvText << ofHeads << " of " << layer << kvVerb << " off the noise floor at tokens "
            << s.firstToken << "-" << s.lastToken << ", and no tested explanation brings it back" << spread();
    } else if (!dcpShare.empty()) {
        // Decode context parallelism: the positions of some DCP ranks, which no head or span names.
        s.pattern = SuspectPattern::TpRank;
        s.dcpRanks = dcpShare;
        for (int h : onset.heads)
            for (int d : dcpShare)
                for (int r : config.layout(config.groups[std::size_t(onset.group)]).ranksHolding(h, d))
                    if (std::find(s.tpRanks.begin(), s.tpRanks.end(), r) == s.tpRanks.end())
                        s.tpRanks.push_back(r);
        std::sort(s.tpRanks.begin(), s.tpRanks.end());
        why << kvText << ofHeads << " of " << layer << kvVerb << " off the noise floor only at the positions DCP rank(s) "
            << joinInts(dcpShare) << " of " << config.dcpSize << " hold (TP rank(s) " << joinInts(s.tpRanks)
            << "; runs of " << config.cpInterleave << " position(s) dealt in turn), tokens " << s.firstToken << "-"
            << s.lastToken << spread();
    } else if (explained && s.hypothesis.kind == "replica_head") {
        // A rank read holding another head: the rank is the place, the head it should hold the data.
        s.pattern = SuspectPattern::TpRank;
        s.tpRanks = {int(s.hypothesis.parameter("rank"))};
        s.heads = {int(s.hypothesis.parameter("should_hold_head"))};
        narrowToOwnHeads(p, onset, s);
        why << kvText << " of head " << s.heads.front() << " of " << layer << kvVerb << " off the noise floor at tokens "
            << s.firstToken << "-" << s.lastToken << ": TP rank " << s.tpRanks.front() << ", whose copy the analysis reads, holds head "
            << s.hypothesis.parameter("holds_head") << "'s, and its replica on rank " << s.hypothesis.parameter("replica_rank")
            << " differs from it" << spread();
    } else if (!mappedRanks.empty()) {
        s.pattern = SuspectPattern::TpRank;
        s.tpRanks = mappedRanks;
        why << kvText << ofHeads << " of " << layer << kvVerb << " off the noise floor at tokens " << s.firstToken << "-"
            << s.lastToken << ", as the shards of TP ranks " << joinInts(mappedRanks) << " exchanged predict" << spread();
    } else if (p.headsOf(L0) > 1 && (!mappedHeads.empty() || onset.oneHead || onset.heads.size() == 1)) {
        s.pattern = SuspectPattern::Head;
        s.heads = mappedHeads;
        if (s.heads.empty())
            s.heads = {int(std::max_element(onset.perHead.begin(), onset.perHead.end()) - onset.perHead.begin())};
        narrowToOwnHeads(p, onset, s);  // the sentence tells the heads' own tokens and parts, as the fields do
        const std::string headKv = s.kv == "kv" ? kTitle + " and " + vTitle : s.kv == "k" ? kTitle : vTitle;
        why << "Only head" << (s.heads.size() > 1 ? "s " : " ") << joinInts(s.heads) << " of " << layer
            << (s.heads.size() > 1 ? " are" : " is") << " off the noise floor (" << headKv << "), from token "
            << s.firstToken << " (" << s.phase << ")" << spread();
    } else if (!ranks.empty()) {
        s.pattern = SuspectPattern::TpRank;
        s.tpRanks = ranks;
        why << "Only heads " << joinInts(onset.heads) << " of " << layer << ", the heads TP rank(s) " << joinInts(ranks)
            << " hold, are off the noise floor, at tokens " << s.firstToken << "-" << s.lastToken << spread();
    } else if (looksLikePositionSpan(onset) ||
               (holdsOnlyDecode(onset) && (s.hypothesis.kind == "rope_offset" || s.hypothesis.kind == "token_shift"))) {
        // (A layer holding decode positions only cannot show a span: a position explanation says it.)
        s.pattern = SuspectPattern::Position;
        why << kvText << ofHeads << " of " << layer << kvVerb << " off the noise floor at positions "
            << s.firstToken << "-" << s.lastToken << " only (" << s.phase << ")" << spread();
    } else {
        s.pattern = SuspectPattern::Layer;
        why << kvText << ofHeads << " of " << layer << kvVerb << " off the noise floor at tokens "
            << s.firstToken << "-" << s.lastToken << spread();
    }
    if (p.headsOf(L0) == 1)
        s.heads.clear();  // an MLA latent: one vector a token, no head to name
    return why.str();
}

}  // namespace

namespace {

// Where a side's value lives, in words.
const char* sideText(const std::string& side)
{
    return side == "actual" ? "the engine's cache" : side == "expected" ? "the reference (expected)"
         : side == "baseline" ? "the fp32 baseline" : "an input";
}

std::optional<Suspect> finiteSuspect(const CaptureLoader& loader, const PromptAnalysis& p, const SuspectThresholds& th,
                                     const std::vector<char>* layersReady, WorkTeam* team, const EarlierRun* earlier);

std::string tokenSpan(std::int64_t first, std::int64_t last)
{
    return first == last ? "token " + std::to_string(first) : "tokens " + std::to_string(first) + "-" + std::to_string(last);
}

}  // namespace

std::optional<Suspect> nonFiniteSuspect(const PromptAnalysis& p, const KvCacheConfig& config,
                                        const std::vector<char>* layersReady)
{
    std::vector<const NonFiniteCell*> cells;  // of ready layers
    for (const NonFiniteCell& c : p.nonFinite)
        if (c.layer >= 0 && std::size_t(c.layer) < p.layers.size() && layerIsReady(layersReady, c.layer))
            cells.push_back(&c);
    if (cells.empty())
        return std::nullopt;
    const int L0 = (*std::min_element(cells.begin(), cells.end(), [](auto* a, auto* b) { return a->layer < b->layer; }))->layer;
    Suspect s;
    s.pattern = SuspectPattern::NonFinite;
    s.score = std::numeric_limits<double>::infinity();
    s.prompts = {p.id};
    s.firstLayer = p.layers[std::size_t(L0)];
    std::set<int> layers, heads;
    std::set<std::tuple<std::int64_t, int, KvPart>> distinct;  // a cell held by two sides counts once
    std::map<std::string, int> sides;
    int nan = 0, inf = 0, parts[2] = {0, 0};
    const NonFiniteCell* first = nullptr;  // the engine's first, else the first
    for (const NonFiniteCell* c : cells) {
        layers.insert(c->layer);
        if (c->layer != L0)
            continue;
        heads.insert(c->head);
        distinct.insert({c->token, c->head, c->part});
        ++sides[c->side];
        ++parts[std::size_t(c->part)];
        (c->value == "nan" ? nan : inf) += c->value.empty() ? 0 : 1;
        s.firstToken = s.firstToken < 0 ? c->token : std::min(s.firstToken, c->token);
        s.lastToken = std::max(s.lastToken, c->token);
        if (!first || (c->side == "actual" && first->side != "actual"))
            first = c;
    }
    for (int l : layers)
        s.layers.push_back(p.layers[std::size_t(l)]);
    s.heads.assign(heads.begin(), heads.end());
    s.kv = parts[0] && parts[1] ? "kv" : parts[0] ? "k" : "v";
    s.phase = phaseOf(s.firstToken, s.lastToken, p.promptLen);
    const int group = std::size_t(L0) < p.layerGroups.size() ? p.layerGroups[std::size_t(L0)] : -1;
    if (group >= 0 && std::size_t(group) < config.groups.size() && p.headsOf(L0) > 1) {
        const TpLayout layout = config.layout(config.groups[std::size_t(group)]);
        std::set<int> ranks;
        for (int h : s.heads)
            for (int r : layout.ranksHolding(h))
                ranks.insert(r);
        s.tpRanks.assign(ranks.begin(), ranks.end());
    }
    s.worstLayer = L0;
    s.worstToken = first->token;
    s.worstHead = first->head;
    s.worstPart = first->part;

    // What it is and which side holds it: the engine's cache, or a reference side (whose own
    // comparison then means nothing there).
    const std::string what = nan && inf ? "NaN and infinity" : inf ? "infinity" : nan ? "NaN" : "NaN or infinity";
    std::string where;
    for (const char* side : {"actual", "expected", "baseline"})
        if (sides.count(side))
            where += std::string(where.empty() ? "" : " and ") + sideText(side);
    if (where.empty())
        where = sideText("");
    const bool engine = sides.count("actual") > 0;
    const std::string heading = p.headsOf(L0) == 1 ? "" : (s.heads.size() == 1 ? " of head " : " of heads ") + joinInts(s.heads);
    const std::string kTitle = partTitle(p, KvPart::K), vTitle = partTitle(p, KvPart::V);
    const std::string partText = s.kv == "kv" ? kTitle + " and " + vTitle : s.kv == "k" ? kTitle : vTitle;
    Hypothesis h;
    h.kind = "non_finite";
    h.parameters = {{"cells", double(distinct.size())}, {"nan_cells", double(nan)}, {"inf_cells", double(inf)}};
    for (const char* side : {"actual", "expected", "baseline"})
        h.parameters.push_back({std::string(side) + "_cells", double(sides.count(side) ? sides[side] : 0)});
    h.text = where + " holds " + what + " in " + partText + heading + " at " + tokenSpan(s.firstToken, s.lastToken) +
             (engine ? "" : ", not the engine's cache");
    h.residualFloors = 0;
    h.errorFloors = std::nan("");  // no floor measures it
    h.explainedShare = 1;
    s.hypothesis = h;
    s.tried = {h};
    std::ostringstream why;
    why << partText << heading << " of " << shortLayerName(s.firstLayer) << " hold" << (distinct.size() == 1 ? "s " : " ")
        << what << " in " << where << ", at " << tokenSpan(s.firstToken, s.lastToken) << " (" << s.phase << "): "
        << distinct.size() << " cell(s), off whatever the floor";
    if (layers.size() > 1)
        why << "; later layers hold it too (" << layerList(s.layers, 1) << ")";
    why << (engine ? ". A NaN or infinity in the cache is a bug by itself; look at what wrote it."
                   : ". The engine's cache is finite there: the reference is broken at that cell, and its comparison means nothing until it is fixed.");
    s.evidence = why.str();
    s.evidencePrompt = p.id;
    return s;
}

std::vector<Suspect> findSuspects(const CaptureLoader& loader, const PromptAnalysis& p, const SuspectThresholds& th,
                                  const std::vector<char>* layersReady, WorkTeam* team, const EarlierRun* earlier)
{
    std::vector<Suspect> out;
    if (std::optional<Suspect> n = nonFiniteSuspect(p, loader.config(), layersReady)) {
        try {
            n->blocks = blocksOf(loader, loader.prompt(p.id), p.layerGroups[std::size_t(n->worstLayer)], n->firstToken,
                                 n->lastToken);
        } catch (const std::exception&) {
            // no blocks to name: the cell is still named
        }
        out.push_back(std::move(*n));
    }
    if (std::optional<Suspect> s = finiteSuspect(loader, p, th, layersReady, team, earlier))
        out.push_back(std::move(*s));
    // A replica holding another head, which no off cell shows (the copy read is right); not
    // a change kvscope diff could attribute.
    if (!earlier)
        for (Suspect& r : replicaHeadSuspects(p))
            out.push_back(std::move(r));
    return out;
}

namespace {

// The path every off position of the onset came by, when the bundle records the paths and
// they are one (analysis/provenance_match.h).
// The positions the analysis compared in the onset layer, in order.
std::vector<std::int64_t> analysedPositions(const PromptAnalysis& p, const Onset& onset)
{
    std::vector<std::int64_t> analysed;
    const Metric linf = metricFor(KvPart::K, MetricKind::Linf);
    for (std::int64_t t = 0; t < p.tokens; ++t)
        for (int h = 0; h < p.headsOf(onset.layer); ++h)
            if (std::isfinite(p.value(linf, onset.layer, t, h))) {
                analysed.push_back(t);
                break;
            }
    return analysed;
}

std::optional<ProvenanceMatch> provenanceOf(const CaptureLoader& loader, const PromptAnalysis& p, const Onset& onset)
{
    const std::vector<ProvenanceRange>& ranges = loader.prompt(p.id).provenance;
    if (ranges.empty())
        return std::nullopt;
    std::vector<std::int64_t> off;
    for (const OffCell& c : onset.cells())
        off.push_back(c.token);
    return matchProvenance(ranges, off, analysedPositions(p, onset));
}

// The chunk boundary the onset's off positions step at, when the bundle records the chunks
// (structural_evidence.h).
std::optional<StructuralFinding> chunkStepOf(const CaptureLoader& loader, const PromptAnalysis& p, const Onset& onset)
{
    const std::vector<ProvenanceRange>& ranges = loader.prompt(p.id).provenance;
    if (ranges.empty())
        return std::nullopt;
    return chunkBoundaryOf(ranges, onset.tokens, analysedPositions(p, onset), p.promptLen);
}

// The onset's suspect, off the noise floor (a NaN or infinity is nonFiniteSuspect's).
std::optional<Suspect> finiteSuspect(const CaptureLoader& loader, const PromptAnalysis& p, const SuspectThresholds& th,
                                     const std::vector<char>* layersReady, WorkTeam* team, const EarlierRun* earlier)
{
    const KvCacheConfig& config = loader.config();
    const OffFloor floor = findOffFloor(p, th, layersReady, team, earlier);
    if (floor.affected.empty())
        return std::nullopt;
    const Onset onset(p, config, floor, layersReady);
    const int L0 = onset.layer;

    Suspect s;
    s.prompts = {p.id};
    s.firstLayer = p.layers[std::size_t(L0)];
    for (int l : floor.affected)
        s.layers.push_back(p.layers[std::size_t(l)]);
    std::vector<double> offRatios;
    for (const OffCell& c : onset.cells())
        offRatios.push_back(c.ratio);
    s.score = median(offRatios);
    s.firstToken = onset.firstToken();
    s.lastToken = onset.lastToken();
    s.phase = phaseOf(s.firstToken, s.lastToken, p.promptLen);
    s.kv = onset.kv;
    s.heads = onset.heads;
    s.worstLayer = L0;
    s.worstToken = onset.worst->token;
    s.worstHead = onset.worst->head;
    s.worstPart = onset.worst->part;

    const Explanation e = explainSuspect(loader, p, th, floor, onset, s);
    std::ostringstream why;
    why << placeSuspect(loader, p, floor, onset, e.explained, s);
    if (e.hypotheses.empty())
        why << ". No explanation could be tested (the layer could not be read again).";
    else if (e.partly)
        why << ". Explained in part: " << s.hypothesis.text << ", for " << int(std::lround(100 * s.hypothesis.explainedShare))
            << "% of the off cells (back within " << floorsText(e.bound) << " floors); the rest is unexplained.";
    else if (e.explained)
        why << ". Explained: " << s.hypothesis.text << " (residual " << floorsText(s.hypothesis.residualFloors)
            << " floors, from " << floorsText(s.hypothesis.errorFloors) << ").";
    else if (!s.hypothesis.kind.empty())
        why << ". Nearest: " << s.hypothesis.text << " (residual " << floorsText(s.hypothesis.residualFloors)
            << " floors, from " << floorsText(s.hypothesis.errorFloors) << ").";
    else
        why << ". None of the " << e.hypotheses.size() << " tested came close (none removes half the error above noise).";
    if (s.measured)
        why << " Measured: " << s.measured->text << ".";
    attribute(loader, p, onset, s);
    if ((s.provenance = provenanceOf(loader, p, onset)))
        why << " " << s.provenance->text;
    if ((s.structure = chunkStepOf(loader, p, onset)))
        why << " " << s.structure->text;
    s.evidence = why.str();
    s.evidencePrompt = p.id;
    return s;
}

}  // namespace

std::vector<Suspect> poolSuspects(const std::vector<std::vector<Suspect>>& perPrompt)
{
    std::vector<Suspect> pooled;
    auto unite = [](auto& into, const auto& from) {
        for (const auto& x : from)
            if (std::find(into.begin(), into.end(), x) == into.end())
                into.push_back(x);
    };
    for (const std::vector<Suspect>& list : perPrompt)
        for (const Suspect& s : list) {
            auto it = std::find_if(pooled.begin(), pooled.end(), [&](const Suspect& q) {
                return q.pattern == s.pattern && q.firstLayer == s.firstLayer;
            });
            if (it == pooled.end()) {
                pooled.push_back(s);
                continue;
            }
            Suspect& q = *it;
            unite(q.prompts, s.prompts);
            unite(q.layers, s.layers);
            unite(q.heads, s.heads);
            unite(q.tpRanks, s.tpRanks);
            unite(q.dcpRanks, s.dcpRanks);
            unite(q.sharedBy, s.sharedBy);
            if (q.sharedBlock < 0)
                q.sharedBlock = s.sharedBlock;
            std::sort(q.heads.begin(), q.heads.end());
            std::sort(q.tpRanks.begin(), q.tpRanks.end());
            std::sort(q.dcpRanks.begin(), q.dcpRanks.end());
            for (const SuspectBlock& b : s.blocks)
                if (std::none_of(q.blocks.begin(), q.blocks.end(), [&](const SuspectBlock& x) {
                        return x.group == b.group && x.logical == b.logical && x.physical == b.physical;
                    }))
                    q.blocks.push_back(b);
            if (q.kv != s.kv)
                q.kv = "kv";
            if (q.phase != s.phase)
                q.phase = "both";
            q.firstToken = std::min(q.firstToken, s.firstToken);
            q.lastToken = std::max(q.lastToken, s.lastToken);
            if (s.score > q.score) {  // the evidence, its explanation and its cell come from the best prompt
                q.score = s.score;
                q.evidence = s.evidence;
                q.evidencePrompt = s.evidencePrompt;
                q.hypothesis = s.hypothesis;
                q.tried = s.tried;
                q.measured = s.measured;
                q.structure = s.structure;
                q.worstLayer = s.worstLayer;
                q.worstToken = s.worstToken;
                q.worstHead = s.worstHead;
                q.worstPart = s.worstPart;
            }
        }
    std::stable_sort(pooled.begin(), pooled.end(), [](const Suspect& a, const Suspect& b) { return a.score > b.score; });
    return pooled;
}

}  // namespace kvscope
