#include "analysis/whose_kv.h"

#include "analysis/map_spec.h"
#include "kv/capture_loader.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <map>
#include <set>

namespace kvscope {

namespace {

const double kInf = std::numeric_limits<double>::infinity();
constexpr std::size_t kSpreadTokens = 4;   // off tokens searched, evenly over the span,
constexpr std::size_t kLatestTokens = 4;   // and the latest (the positions every layer type still holds)
constexpr std::size_t kProbeCells = 8;     // cells whose nearest vector in another prompt gives the offset
constexpr std::int64_t kReadWindow = 64;   // positions read at a time around a searched token
constexpr std::int64_t kOneChunkRow = 4096;  // a reference chunk longer: the row is one chunk
constexpr std::int64_t kMaxWholeValues = std::int64_t(1) << 25;  // another prompt's layer read whole up to this

HeadDims dimsOf(const PromptAnalysis& p, int layer)
{
    return std::size_t(layer) < p.layerDims.size() ? p.layerDims[std::size_t(layer)] : p.dims;
}
int dimOf(const HypothesisInput& in, KvPart part)
{
    return dimsOf(in.prompt, in.layer).of(part);
}

// The off cells searched for: every cell at a few tokens (spread over the off span, and the
// latest ones), where the engine and the reference hold it.
std::vector<OffCell> searchedCells(const HypothesisInput& in)
{
    std::set<std::int64_t> offTokens;  // of the cells read (the engine's sampled positions)
    for (const OffCell& c : in.cells)
        if (in.engine.at(c.part, c.token, c.head) && in.reference.at(c.part, c.token, c.head))
            offTokens.insert(c.token);
    const std::vector<std::int64_t> all(offTokens.begin(), offTokens.end());
    std::set<std::int64_t> chosen;
    for (std::size_t i = 0; i < kSpreadTokens && i < all.size(); ++i)
        chosen.insert(all[i * all.size() / std::min(kSpreadTokens, all.size())]);
    for (std::size_t i = 0; i < kLatestTokens && i < all.size(); ++i)
        chosen.insert(all[all.size() - 1 - i]);
    std::vector<OffCell> cells;
    for (const OffCell& c : in.cells)
        if (chosen.count(c.token) && in.engine.at(c.part, c.token, c.head) && in.reference.at(c.part, c.token, c.head))
            cells.push_back(c);
    return cells;
}

double cellResidual(const HypothesisInput& in, const OffCell& c, const float* predicted)
{
    if (!predicted)
        return kInf;
    return in.ratios.between(in.layer, c.token, c.part, in.reference.at(c.part, c.token, c.head), predicted,
                             in.engine.at(c.part, c.token, c.head), dimOf(in, c.part));
}

// A source's prediction of the cells: each (head, part) from the source head that predicts it
// best (or its own head only), over the cells the source holds.
struct Fit {
    double residual = kInf;
    double share = 0;
    int held = 0;                    // cells the source holds
    std::set<std::int64_t> tokens;   // their tokens
    std::map<int, int> heads;        // head -> source head (of K where both parts are off)
};
using Source = std::function<const float*(const OffCell&, int head)>;

Fit fit(const HypothesisInput& in, const std::vector<OffCell>& cells, int sourceHeads, bool ownHead, const Source& source)
{
    std::map<std::pair<int, int>, std::vector<const OffCell*>> groups;  // (part, head)
    for (const OffCell& c : cells)
        groups[{int(c.part), c.head}].push_back(&c);
    Fit f;
    std::vector<double> all;
    for (const auto& [key, group] : groups) {
        const int head = key.second;
        std::vector<double> best;
        std::vector<std::int64_t> bestTokens;
        double bestMedian = kInf;
        int bestHead = head;
        for (int j = ownHead ? head : 0; j < (ownHead ? std::min(head + 1, sourceHeads) : sourceHeads); ++j) {
            std::vector<double> r;
            std::vector<std::int64_t> tokens;
            for (const OffCell* c : group)
                if (const float* v = source(*c, j)) {
                    r.push_back(cellResidual(in, *c, v));
                    tokens.push_back(c->token);
                }
            if (r.empty())
                continue;
            const double m = median(r);
            if (best.empty() || m < bestMedian)
                bestMedian = m, best = r, bestTokens = tokens, bestHead = j;
        }
        all.insert(all.end(), best.begin(), best.end());
        f.tokens.insert(bestTokens.begin(), bestTokens.end());
        if (!best.empty() && (key.first == int(KvPart::K) || !f.heads.count(head)))
            f.heads[head] = bestHead;
    }
    f.held = int(all.size());
    if (f.held < std::min<int>(kWhoseMinCells, int(cells.size())) || f.held < 3)
        return f;
    f.residual = median(all);
    f.share = double(std::count_if(all.begin(), all.end(), [&](double x) { return x <= in.explained; })) / double(all.size());
    return f;
}

std::string partsOf(const HypothesisInput& in, const std::vector<OffCell>& cells)
{
    bool k = false, v = false;
    for (const OffCell& c : cells)
        (c.part == KvPart::K ? k : v) = true;
    return k && v ? partTitle(in.prompt, KvPart::K) + " and " + partTitle(in.prompt, KvPart::V)
                  : partTitle(in.prompt, k ? KvPart::K : KvPart::V);
}

std::string span(std::int64_t first, std::int64_t last)
{
    return first == last ? "position " + std::to_string(first)
                         : "positions " + std::to_string(first) + "-" + std::to_string(last);
}

// How many positions at a time a reference is best read: a whole row when it is one chunk.
// (An older bundle's reference row is one chunk, which each window would read whole again.)
std::int64_t readWindow(const WhoseKvInput& in, const std::string& prompt, const std::string& layer, std::int64_t seq,
                        std::int64_t window = kReadWindow)
{
    return in.loader.referencePositionsPerChunk(prompt, in.role, layer) > kOneChunkRow ? seq : window;
}

Hypothesis withError(Hypothesis h, const std::vector<OffCell>& cells)
{
    std::vector<double> before;
    for (const OffCell& c : cells)
        before.push_back(c.ratio);
    h.errorFloors = median(before);
    return h;
}

// other_layer: the same positions of another layer of this prompt, nearest layers first.
std::optional<Hypothesis> otherLayer(const WhoseKvInput& in, const std::vector<OffCell>& cells)
{
    const HypothesisInput& at = in.onset;
    const PromptAnalysis& p = at.prompt;
    const int heads = p.headsOf(at.layer);
    std::vector<int> order;
    for (int l = 0; l < int(p.layers.size()); ++l)
        if (l != at.layer && p.headsOf(l) == heads && dimsOf(p, l).k == dimOf(at, KvPart::K) &&
            dimsOf(p, l).v == dimOf(at, KvPart::V))
            order.push_back(l);
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return std::abs(a - at.layer) < std::abs(b - at.layer); });
    if (order.size() > std::size_t(kMaxWhoseLayers))
        order.resize(std::size_t(kMaxWhoseLayers));
    std::set<std::int64_t> offTokens;
    for (const OffCell& c : cells)
        offTokens.insert(c.token);
    const std::vector<std::int64_t> tokens(offTokens.begin(), offTokens.end());
    // A first pass at two tokens (the latest, which every window type still holds, and the
    // middle one), one position a read: most layers are ruled out there.
    const std::vector<std::int64_t> coarseTokens = {tokens.back(), tokens[tokens.size() / 2]};
    std::vector<OffCell> coarse;
    for (const OffCell& c : cells)
        if (c.token == coarseTokens[0] || c.token == coarseTokens[1])
            coarse.push_back(c);
    const auto readAt = [&](const std::string& name, const std::vector<std::int64_t>& positions) {
        const SampledLayer source = SampledLayer::read(positions, p.tokens, readWindow(in, p.id, name, p.tokens, 1), [&](PositionRange w) {
            return in.loader.referenceSource(p.id, in.role, name, w);
        });
        const bool fits = source.heads == heads && source.seq == p.tokens && source.dims.k == dimOf(at, KvPart::K) &&
                          source.dims.v == dimOf(at, KvPart::V);
        return fits ? source : SampledLayer{};
    };
    for (int l : order) {
        const std::string& name = p.layers[std::size_t(l)];
        SampledLayer source;
        Fit f;
        try {
            source = readAt(name, coarseTokens);
            const auto from = [&](const OffCell& c, int j) { return source.heads ? source.at(c.part, c.token, j) : nullptr; };
            if (fit(at, coarse, heads, false, from).residual > at.explained)
                continue;
            source = readAt(name, tokens);
            f = fit(at, cells, heads, false, from);
        } catch (const std::exception&) {
            continue;  // a layer that cannot be read is no candidate
        }
        if (f.residual > at.explained)
            continue;
        Hypothesis h{"other_layer", {{"layer", double(l)}}, "", f.residual, 0, f.share};
        std::string mapped;
        for (const auto& [head, from] : f.heads)
            if (head != from) {
                h.parameters.push_back({"head_" + std::to_string(head), double(from)});
                mapped += (mapped.empty() ? "" : ", ") + std::string("head ") + std::to_string(head) + " its head " +
                          std::to_string(from);
            }
        h.text = shortLayerName(p.layers[std::size_t(at.layer)]) + " holds " + shortLayerName(name) + "'s " +
                 partsOf(at, cells) + (mapped.empty() ? "" : " (" + mapped + ")") +
                 ": layer sharing, or a layer index off by one (tested at " +
                 (f.tokens.size() == offTokens.size() ? std::to_string(f.tokens.size()) + " positions"
                                                      : "the " + std::to_string(f.tokens.size()) + " of " + std::to_string(offTokens.size()) +
                                                            " searched positions " + shortLayerName(name) + " holds") + ")";
        return withError(h, cells);
    }
    return std::nullopt;
}

// The offset of another prompt's positions that a few cells' nearest vectors agree on (same
// head and part), if most of them do.
std::optional<std::int64_t> agreedOffset(const HypothesisInput& at, const std::vector<OffCell>& cells, const SampledLayer& other)
{
    std::map<std::int64_t, int> votes;
    int probes = 0;
    for (std::size_t i = 0; i < cells.size() && probes < int(kProbeCells); i += std::max<std::size_t>(1, cells.size() / kProbeCells)) {
        const OffCell& c = cells[i];
        double best = kInf;
        std::int64_t bestPos = -1;
        for (std::int64_t t = 0; t < other.seq; ++t)
            if (const float* v = other.at(c.part, t, c.head)) {
                const double r = cellResidual(at, c, v);
                if (r < best)
                    best = r, bestPos = t;
            }
        ++probes;
        if (bestPos >= 0 && best <= at.explained)
            ++votes[bestPos - c.token];
    }
    const auto most = std::max_element(votes.begin(), votes.end(), [](const auto& a, const auto& b) { return a.second < b.second; });
    if (most == votes.end() || 2 * most->second <= probes)
        return std::nullopt;
    return most->first;
}

// other_prompt: the same layer of another prompt, at the same positions or at one offset.
std::optional<Hypothesis> otherPrompt(const WhoseKvInput& in, const std::vector<OffCell>& cells)
{
    const HypothesisInput& at = in.onset;
    const PromptAnalysis& p = at.prompt;
    const std::string& layer = p.layers[std::size_t(at.layer)];
    const int heads = p.headsOf(at.layer);
    std::vector<std::int64_t> tokens;
    for (const OffCell& c : cells)
        tokens.push_back(c.token);
    // The span named: the rows (tokens off in more than half the heads), not a stray noise cell.
    std::map<std::int64_t, std::set<int>> rowHeads;
    for (const OffCell& c : at.cells)
        rowHeads[c.token].insert(c.head);
    std::int64_t first = p.tokens, last = -1;
    for (const auto& [token, h] : rowHeads)
        if (2 * int(h.size()) > heads)
            first = std::min(first, token), last = std::max(last, token);
    if (last < 0)
        first = rowHeads.begin()->first, last = rowHeads.rbegin()->first;
    int index = -1, searched = 0;
    for (const PromptInfo& q : in.loader.prompts()) {
        ++index;
        if (q.id == p.id || !q.problems.empty() || searched >= kMaxWhosePrompts)
            continue;
        ++searched;
        try {
            const std::int64_t seq = in.loader.sequenceLength(q.id);
            const auto read = [&](std::vector<std::int64_t> positions, std::int64_t window) {
                return SampledLayer::read(std::move(positions), seq, window, [&](PositionRange w) {
                    return in.loader.referenceSource(q.id, in.role, layer, w);
                });
            };
            const auto explainAt = [&](const SampledLayer& other, std::int64_t offset) -> std::optional<Hypothesis> {
                if (other.heads != heads || other.dims.k != dimOf(at, KvPart::K) || other.dims.v != dimOf(at, KvPart::V))
                    return std::nullopt;
                const Fit f = fit(at, cells, heads, true, [&](const OffCell& c, int j) { return other.at(c.part, c.token + offset, j); });
                if (f.residual > at.explained)
                    return std::nullopt;
                Hypothesis h{"other_prompt", {{"prompt_index", double(index)}, {"offset", double(offset)}}, "", f.residual, 0, f.share};
                h.text = span(first, last) + " hold " + q.id + "'s " + span(first + offset, last + offset) + " (" +
                         partsOf(at, cells) + "): another prompt's KV, as a prefix-cache or LoRA key collision gives";
                return withError(h, cells);
            };
            // The same positions first: a few reads.
            if (auto h = explainAt(read(tokens, readWindow(in, q.id, layer, seq)), 0))
                return h;
            // Else the layer whole, bounded, and the offset its nearest vectors agree on.
            if (seq * heads * (dimOf(at, KvPart::K) + dimOf(at, KvPart::V)) > kMaxWholeValues)
                continue;
            std::vector<std::int64_t> all(static_cast<std::size_t>(seq));
            for (std::int64_t t = 0; t < seq; ++t)
                all[std::size_t(t)] = t;
            const SampledLayer whole = read(all, 4096);
            if (whole.heads != heads)
                continue;
            if (const std::optional<std::int64_t> offset = agreedOffset(at, cells, whole); offset && *offset != 0)
                if (auto h = explainAt(whole, *offset))
                    return h;
        } catch (const std::exception&) {
            continue;  // a prompt that cannot be read is no candidate
        }
    }
    return std::nullopt;
}

}  // namespace

std::optional<Hypothesis> whoseKv(const WhoseKvInput& in)
{
    const std::vector<OffCell> cells = searchedCells(in.onset);
    if (cells.empty())
        return std::nullopt;
    if (auto h = otherLayer(in, cells))
        return h;
    return otherPrompt(in, cells);
}

}  // namespace kvscope
