#include "analysis/suspect_patterns.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>

namespace kvscope {

Onset::Onset(const PromptAnalysis& p, const KvCacheConfig& config, const OffFloor& floor, const std::vector<char>* ready)
    : prompt(p)
    , config(config)
    , floor(floor)
    , layersReady(ready)
    , layer(floor.affected.front())
    , group(p.layerGroups[std::size_t(layer)])
    , perHead(std::size_t(p.heads), 0)
{
    worst = &cells().front();
    for (const OffCell& c : cells()) {
        ++perHead[std::size_t(c.head)];
        ++perPart[std::size_t(c.part)];
        tokens.insert(c.token);
        if (c.ratio > worst->ratio)
            worst = &c;
    }
    const int offCount = int(cells().size());
    kv = partsOf(perPart[0], perPart[1]);
    const int top = *std::max_element(perHead.begin(), perHead.end());
    for (int h = 0; h < p.heads; ++h)
        if (perHead[std::size_t(h)] > 0 && perHead[std::size_t(h)] * 5 >= top)
            heads.push_back(h);
    oneHead = top * 10 >= offCount * 9;
    allHeads = int(heads.size()) == p.headsOf(layer);
}

bool Onset::ready(int l) const
{
    return layerIsReady(layersReady, l);
}

const char* phaseOf(std::int64_t first, std::int64_t last, std::int64_t promptLen)
{
    return last < promptLen ? "prefill" : first >= promptLen ? "decode" : "both";
}

const char* partsOf(int kCells, int vCells)
{
    const int all = kCells + vCells;
    return vCells * 10 <= all ? "k" : kCells * 10 <= all ? "v" : "kv";
}

std::set<std::int64_t> rowTokens(const Onset& o)
{
    std::map<std::int64_t, std::set<int>> heads;
    for (const OffCell& c : o.cells())
        heads[c.token].insert(c.head);
    std::set<std::int64_t> rows;
    for (const auto& [token, h] : heads)
        if (2 * int(h.size()) > o.prompt.headsOf(o.layer))
            rows.insert(token);
    return rows;
}

bool looksLikeBlock(const Onset& o)
{
    const PromptAnalysis& p = o.prompt;
    if (!o.allHeads || o.kv != "kv")
        return false;
    for (int l = 0; l < o.layer; ++l)
        if (o.ready(l) && p.layerGroups[std::size_t(l)] == o.group)
            return false;  // an earlier layer of the group is clean: not the group's blocks
    // The rows (a block holds every head): a stray noise cell in one head is no part of it.
    const std::set<std::int64_t> rows = rowTokens(o);
    if (rows.empty())
        return false;
    const std::int64_t blockSize = o.config.positionsPerEntry(o.config.groups[std::size_t(o.group)]);
    const std::int64_t first = *rows.begin() / blockSize, last = *rows.rbegin() / blockSize;
    if (last - first > 1)
        return false;
    const std::int64_t begin = first * blockSize, end = std::min(p.tokens, (last + 1) * blockSize);
    if (double(rows.size()) < 0.5 * double(end - begin))
        return false;
    int sameGroup = 0, sameGroupHit = 0, otherHit = 0;
    for (int l = 0; l < int(p.layers.size()); ++l) {
        if (!o.ready(l) || l == o.layer)
            continue;
        const std::vector<OffCell>& off = o.floor.cells[std::size_t(l)];
        int inside = 0;
        for (const OffCell& c : off)
            inside += c.token >= begin && c.token < end;
        if (p.layerGroups[std::size_t(l)] == o.group) {
            ++sameGroup;
            sameGroupHit += inside * 2 >= int(off.size()) && inside > 0;
        } else {
            otherHit += inside > 0 && std::find(o.floor.affected.begin(), o.floor.affected.end(), l) != o.floor.affected.end();
        }
    }
    return otherHit == 0 && (sameGroup == 0 || (sameGroupHit > 0 && sameGroupHit * 2 >= sameGroup));
}

namespace {

// The tokens the onset layer holds (K of head 0 finite).
std::vector<std::int64_t> heldTokens(const Onset& o)
{
    std::vector<std::int64_t> held;
    for (std::int64_t t = 0; t < o.prompt.tokens; ++t)
        if (std::isfinite(o.floor.ratios.at(o.layer, t, 0, KvPart::K)))
            held.push_back(t);
    return held;
}

}  // namespace

double tokenCoverage(const Onset& o)
{
    const std::vector<std::int64_t> held = heldTokens(o);
    return held.empty() ? 0.0 : double(o.tokens.size()) / double(held.size());
}

bool looksLikePositionSpan(const Onset& o)
{
    const std::vector<std::int64_t> held = heldTokens(o);
    std::int64_t inSpan = 0, outside = 0;
    for (std::int64_t t : held)
        (t >= o.firstToken() && t <= o.lastToken() ? inSpan : outside)++;
    return outside > 0 && double(o.tokens.size()) >= 0.9 * double(inSpan);
}

bool holdsOnlyDecode(const Onset& o)
{
    const std::vector<std::int64_t> held = heldTokens(o);
    return !held.empty() && held.front() >= o.prompt.promptLen;
}

int windowEdgeOf(const Onset& o)
{
    // The error must be seen to start: the onset layer holds a clean token before it. A sliding
    // layer whose reference keeps only the last window - 1 positions can hold nothing earlier,
    // and a fault over the whole layer would then look as if it started at the window's edge.
    const std::vector<std::int64_t> held = heldTokens(o);
    if (held.empty() || held.front() >= o.firstToken())
        return 0;
    for (int l = 0; l <= o.layer; ++l) {
        const KvCacheGroup& g = o.config.groups[std::size_t(o.prompt.layerGroups[std::size_t(l)])];
        if (!g.slidingWindow)
            continue;
        const int w = *g.slidingWindow;
        if (o.firstToken() < w - 2 || o.firstToken() > w + 1)
            continue;
        // From the edge on to the end, most tokens off.
        std::int64_t after = 0;
        for (std::int64_t t : held)
            after += t >= o.firstToken();
        if (after > 0 && double(o.tokens.size()) >= 0.5 * double(after))
            return w;
    }
    return 0;
}

namespace {

// The sequence length of the snapshot that wrote `token` (snapshot_merge.h), or 0.
std::int64_t seqLenAt(const std::vector<SnapshotInfo>& snapshots, std::int64_t token)
{
    std::size_t s = 0;
    while (s + 1 < snapshots.size() && token >= snapshots[s].validatedUntil)
        ++s;
    if (snapshots.empty() || snapshots[s].batchRow < 0 || std::size_t(snapshots[s].batchRow) >= snapshots[s].seqLens.size())
        return 0;
    return snapshots[s].seqLen();
}

enum class WindowType { Sliding, Full, Other };

WindowType windowTypeOf(const KvCacheGroup& g)
{
    if (g.slidingWindow)
        return WindowType::Sliding;
    return g.specType == SpecType::FullAttention || g.specType == SpecType::Mla ? WindowType::Full : WindowType::Other;
}

}  // namespace

std::optional<WindowMismatch> windowMismatchOf(const Onset& o, const std::vector<SnapshotInfo>& snapshots)
{
    const PromptAnalysis& p = o.prompt;
    const auto typeOf = [&](int l) {
        const int g = p.layerGroups[std::size_t(l)];
        return g < 0 || std::size_t(g) >= o.config.groups.size() ? WindowType::Other : windowTypeOf(o.config.groups[std::size_t(g)]);
    };
    const WindowType type = typeOf(o.layer);
    if (type == WindowType::Other)
        return std::nullopt;
    WindowMismatch m;
    m.sliding = type == WindowType::Sliding;
    for (const KvCacheGroup& g : o.config.groups)
        if (g.slidingWindow)
            m.window = *g.slidingWindow;
    const std::set<int> affected(o.floor.affected.begin(), o.floor.affected.end());
    std::int64_t oldestClean = 0, youngestOff = std::numeric_limits<std::int64_t>::max();
    for (int l = 0; l < int(p.layers.size()); ++l) {
        if (!o.ready(l) || typeOf(l) == WindowType::Other)
            continue;
        if (typeOf(l) != type) {
            if (affected.count(l))
                return std::nullopt;  // the other type is affected too: not the type's window
            ++m.otherLayers;
            continue;
        }
        if (!affected.count(l))
            return std::nullopt;
        m.layers.push_back(l);
        std::map<std::int64_t, std::set<int>> offHeads;  // token -> heads with an off cell
        for (const OffCell& c : o.floor.cells[std::size_t(l)])
            offHeads[c.token].insert(c.head);
        for (std::int64_t t = 0; t < p.tokens; ++t) {
            if (!std::isfinite(o.floor.ratios.at(l, t, 0, KvPart::K)))
                continue;  // not held
            const std::int64_t age = seqLenAt(snapshots, t) - t;
            if (age <= 0)
                return std::nullopt;  // no snapshot length to age it by
            m.referenceKept = std::max(m.referenceKept, age);
            const auto off = offHeads.find(t);
            if (off == offHeads.end())
                oldestClean = std::max(oldestClean, age);
            else if (2 * int(off->second.size()) > p.headsOf(l)) {
                youngestOff = std::min(youngestOff, age);
                if (l == o.layer)
                    m.first = m.first < 0 ? t : std::min(m.first, t), m.last = std::max(m.last, t);
            }
        }
    }
    // Two layers of the type at least, something kept, and the kept ages and the off ones apart.
    if (m.layers.size() < 2 || oldestClean == 0 || m.first < 0 || youngestOff <= oldestClean)
        return std::nullopt;
    m.kept = oldestClean;
    return m;
}

std::vector<int> ranksOfHeads(const Onset& o)
{
    if (o.config.tpSize < 2 || o.allHeads || o.heads.size() < 2)
        return {};
    const TpLayout layout = o.config.layout(o.config.groups[std::size_t(o.group)]);
    std::set<int> ranks;
    for (int h : o.heads)
        for (int r : layout.ranksHolding(h))
            ranks.insert(r);
    std::set<int> held;
    for (int h = 0; h < layout.totalHeads; ++h)
        for (int r : layout.ranksHolding(h))
            if (ranks.count(r))
                held.insert(h);
    if (held != std::set<int>(o.heads.begin(), o.heads.end()))
        return {};
    return {ranks.begin(), ranks.end()};
}

std::vector<int> dcpRanksOf(const KvCacheConfig& config, int group, const std::set<std::int64_t>& tokens)
{
    if (config.dcpSize < 2 || tokens.empty())
        return {};
    const KvCacheGroup& g = config.groups[std::size_t(group)];
    std::vector<int> perRank(std::size_t(config.dcpSize), 0);
    for (std::int64_t t : tokens)
        ++perRank[std::size_t(config.slotOf(g, t).dcpRank)];
    const int top = *std::max_element(perRank.begin(), perRank.end());
    std::vector<int> ranks;
    for (int d = 0; d < config.dcpSize; ++d)
        if (perRank[std::size_t(d)] > 0 && perRank[std::size_t(d)] * 5 >= top)
            ranks.push_back(d);
    return ranks;
}

std::vector<int> dcpShareOf(const Onset& o)
{
    const std::vector<int> ranks = dcpRanksOf(o.config, o.group, o.tokens);
    if (ranks.empty() || int(ranks.size()) == o.config.dcpSize)
        return {};
    const KvCacheGroup& g = o.config.groups[std::size_t(o.group)];
    const auto ours = [&](std::int64_t t) {
        return std::find(ranks.begin(), ranks.end(), o.config.slotOf(g, t).dcpRank) != ranks.end();
    };
    // Positions of the other DCP ranks must lie among the off ones, clean, for the share to
    // be what sets them apart (one off position says nothing of whose share it is).
    std::int64_t held = 0, off = 0, others = 0;
    for (std::int64_t t : heldTokens(o))
        if (t >= o.firstToken() && t <= o.lastToken())
            (ours(t) ? held : others)++;
    for (std::int64_t t : o.tokens)
        off += ours(t);
    return others >= 2 && double(off) >= 0.5 * double(held) ? ranks : std::vector<int>{};
}

}  // namespace kvscope
