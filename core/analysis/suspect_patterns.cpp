#include "analysis/suspect_patterns.h"

#include <algorithm>
#include <cmath>

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

bool looksLikeBlock(const Onset& o)
{
    const PromptAnalysis& p = o.prompt;
    if (!o.allHeads || o.kv != "kv")
        return false;
    for (int l = 0; l < o.layer; ++l)
        if (o.ready(l) && p.layerGroups[std::size_t(l)] == o.group)
            return false;  // an earlier layer of the group is clean: not the group's blocks
    const std::int64_t blockSize = o.config.positionsPerEntry(o.config.groups[std::size_t(o.group)]);
    const std::int64_t first = o.firstToken() / blockSize, last = o.lastToken() / blockSize;
    if (last - first > 1)
        return false;
    const std::int64_t begin = first * blockSize, end = std::min(p.tokens, (last + 1) * blockSize);
    if (double(o.tokens.size()) < 0.5 * double(end - begin))
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
