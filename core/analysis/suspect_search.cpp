#include "analysis/suspect_search.h"

#include "analysis/map_spec.h"
#include "kv/capture_loader.h"
#include "util/work_team.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <iomanip>
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
    }
    return "?";
}

namespace {

struct OffCell {
    std::int64_t token;
    int head;
    KvPart part;
    float ratio;
};

// fn(layer) for every layer, over the team's threads when there is one.
template <typename Fn>
void forEachLayer(WorkTeam* team, int layers, const Fn& fn)
{
    if (team)
        team->run(layers, [&](int layer, int) { fn(layer); });
    else
        for (int layer = 0; layer < layers; ++layer)
            fn(layer);
}

// The median of `v`, which it reorders.
double medianOf(std::vector<double>& v)
{
    if (v.empty())
        return std::nan("");
    const auto mid = v.begin() + std::ptrdiff_t(v.size() / 2);
    std::nth_element(v.begin(), mid, v.end());
    return *mid;
}

double median(std::vector<double> v)
{
    return medianOf(v);
}

// How far each cell is off: its error ratio against the cell's noise floor (three-way). Two-way
// has no dtype-only reference: a cell's L-inf against its layer's median L-inf (faults
// confined to some tokens or heads), and a layer whose median is itself far above the
// capture's typical layer median is judged against that (a whole-layer fault). The floors
// are kept (per token, or per layer), not the ratios: a cell's ratio is one division.
class Ratios {
public:
    Ratios(const PromptAnalysis& p, double layerJump, WorkTeam* team)
        : m_p(p)
    {
        const int layers = int(p.layers.size());
        for (KvPart part : {KvPart::K, KvPart::V}) {
            const Metric m = metricFor(part, MetricKind::Linf);
            std::vector<double>& floors = m_floors[std::size_t(part)];
            if (p.threeWay) {
                floors.resize(std::size_t(layers) * std::size_t(p.tokens));
                forEachLayer(team, layers, [&](int l) {
                    for (std::int64_t t = 0; t < p.tokens; ++t)
                        floors[std::size_t(l) * std::size_t(p.tokens) + std::size_t(t)] =
                            std::max(double(noiseFloor(p, m, l, t)), 1e-10);
                });
                continue;
            }
            floors.assign(std::size_t(layers), std::nan(""));
            forEachLayer(team, layers, [&](int l) {
                std::vector<double> values;
                for (std::int64_t t = 0; t < p.tokens; ++t)
                    for (int h = 0; h < p.heads; ++h)
                        if (const float v = p.value(m, l, t, h); std::isfinite(v))
                            values.push_back(v);
                if (!values.empty())
                    floors[std::size_t(l)] = std::max(median(values), 1e-10);
            });
            std::vector<double> medians;
            for (double floor : floors)
                if (!std::isnan(floor))
                    medians.push_back(floor);
            const double typical = median(medians);
            for (double& floor : floors)
                if (floor > layerJump * typical)
                    floor = typical;
        }
    }
    float at(int layer, std::int64_t token, int head, KvPart part) const
    {
        const Metric m = metricFor(part, MetricKind::Linf);
        const std::vector<double>& floors = m_floors[std::size_t(part)];
        const double floor = m_p.threeWay ? floors[std::size_t(layer) * std::size_t(m_p.tokens) + std::size_t(token)]
                                          : floors[std::size_t(layer)];
        return float(double(m_p.value(m, layer, token, head)) / floor);
    }

private:
    const PromptAnalysis& m_p;
    std::vector<double> m_floors[2];  // [K/V][layer][token] (three-way) or [K/V][layer]
};

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
    const int blockSize = loader.config().groups[std::size_t(group)].blockSize;
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

}  // namespace

std::vector<Suspect> findSuspects(const CaptureLoader& loader, const PromptAnalysis& p, const SuspectThresholds& th,
                                  const std::vector<char>* layersReady, WorkTeam* team)
{
    const KvCacheConfig& config = loader.config();
    const PromptInfo& info = loader.prompt(p.id);
    const Ratios ratios(p, th.layerJump, team);
    const int layers = int(p.layers.size());
    auto ready = [&](int l) {
        return !layersReady || (std::size_t(l) < layersReady->size() && (*layersReady)[std::size_t(l)]);
    };

    // The typical ratio per layer and part: a cache noisier everywhere (fp8, whose noise
    // follows each layer's scale) sets its own floor, unless the layer's typical ratio is far
    // above the capture's (the whole layer is off): then the capture's.
    std::vector<double> threshold[2];
    for (KvPart part : {KvPart::K, KvPart::V}) {
        std::vector<double> typical(static_cast<std::size_t>(layers), std::nan(""));
        forEachLayer(team, layers, [&](int l) {
            if (!ready(l))
                return;
            thread_local std::vector<double> all;  // a layer's ratios, the buffer kept
            all.clear();
            all.reserve(std::size_t(p.tokens) * std::size_t(p.heads));
            for (std::int64_t t = 0; t < p.tokens; ++t)
                for (int h = 0; h < p.heads; ++h)
                    if (const float r = ratios.at(l, t, h, part); std::isfinite(r))
                        all.push_back(r);
            if (!all.empty())
                typical[std::size_t(l)] = medianOf(all);
        });
        std::vector<double> typicals;
        for (double t : typical)
            if (!std::isnan(t))
                typicals.push_back(t);
        const double overall = typicals.empty() ? 1.0 : median(typicals);
        for (int l = 0; l < layers; ++l) {
            double t = std::isnan(typical[std::size_t(l)]) ? overall : typical[std::size_t(l)];
            if (t > th.layerJump * overall)
                t = overall;
            threshold[std::size_t(part)].push_back((p.threeWay ? th.offFloor : th.twoWayFloor) *
                                                   (p.threeWay ? std::max(1.0, t) : 1.0));
        }
    }

    // Off cells per layer; affected layers.
    std::vector<std::vector<OffCell>> off(static_cast<std::size_t>(layers));
    std::vector<char> layerAffected(static_cast<std::size_t>(layers), 0);
    forEachLayer(team, layers, [&](int l) {
        if (!ready(l))
            return;
        std::int64_t cells = 0;
        for (std::int64_t t = 0; t < p.tokens; ++t)
            for (int h = 0; h < p.heads; ++h)
                for (KvPart part : {KvPart::K, KvPart::V}) {
                    const float r = ratios.at(l, t, h, part);
                    if (!std::isfinite(r))
                        continue;
                    ++cells;
                    if (r > threshold[std::size_t(part)][std::size_t(l)])
                        off[std::size_t(l)].push_back({t, h, part, r});
                }
        const std::size_t n = off[std::size_t(l)].size();
        layerAffected[std::size_t(l)] = n >= std::size_t(th.minCells) && double(n) >= th.minFraction * double(cells);
    });
    std::vector<int> affected;
    for (int l = 0; l < layers; ++l)
        if (layerAffected[std::size_t(l)])
            affected.push_back(l);
    if (affected.empty())
        return {};

    // The onset: the first affected layer.
    const int L0 = affected.front();
    const std::vector<OffCell>& cells = off[std::size_t(L0)];
    Suspect s;
    s.prompts = {p.id};
    s.firstLayer = p.layers[std::size_t(L0)];
    for (int l : affected)
        s.layers.push_back(p.layers[std::size_t(l)]);
    std::vector<int> perHead(static_cast<std::size_t>(p.heads), 0);
    int perPart[2] = {0, 0};
    std::set<std::int64_t> tokens;
    std::vector<double> offRatios;
    const OffCell* worst = &cells.front();
    for (const OffCell& c : cells) {
        ++perHead[std::size_t(c.head)];
        ++perPart[std::size_t(c.part)];
        tokens.insert(c.token);
        offRatios.push_back(c.ratio / threshold[std::size_t(c.part)][std::size_t(L0)] * (p.threeWay ? th.offFloor : th.twoWayFloor));
        if (c.ratio > worst->ratio)
            worst = &c;
    }
    s.score = median(offRatios);
    s.firstToken = *tokens.begin();
    s.lastToken = *tokens.rbegin();
    s.phase = s.lastToken < p.promptLen ? "prefill" : s.firstToken >= p.promptLen ? "decode" : "both";
    const int offCount = int(cells.size());
    s.kv = perPart[1] * 10 <= offCount ? "k" : perPart[0] * 10 <= offCount ? "v" : "kv";
    s.worstLayer = L0;
    s.worstToken = worst->token;
    s.worstHead = worst->head;
    s.worstPart = worst->part;

    // The heads that carry the error: those with a fair share of the worst head's off cells.
    const int top = *std::max_element(perHead.begin(), perHead.end());
    std::vector<int> heads;
    for (int h = 0; h < p.heads; ++h)
        if (perHead[std::size_t(h)] > 0 && perHead[std::size_t(h)] * 5 >= top)
            heads.push_back(h);
    const bool oneHead = top * 10 >= offCount * 9;
    const bool allHeads = int(heads.size()) == p.heads;

    const int group = p.layerGroups[std::size_t(L0)];
    const KvCacheGroup& g = config.groups[std::size_t(group)];
    const std::string layer = shortLayerName(s.firstLayer);
    std::ostringstream why;

    // block: K and V of every head at the tokens of one or two blocks of the onset's group,
    // in most of the group's layers from its first one on, and in no layer of another group.
    auto blockLike = [&] {
        if (!allHeads || s.kv != "kv")
            return false;
        for (int l = 0; l < L0; ++l)
            if (ready(l) && p.layerGroups[std::size_t(l)] == group)
                return false;  // an earlier layer of the group is clean: not the group's blocks
        const std::int64_t first = s.firstToken / g.blockSize, last = s.lastToken / g.blockSize;
        if (last - first > 1)
            return false;
        const std::int64_t begin = first * g.blockSize, end = std::min(p.tokens, (last + 1) * g.blockSize);
        if (double(tokens.size()) < 0.5 * double(end - begin))
            return false;
        int sameGroup = 0, sameGroupHit = 0, otherHit = 0;
        for (int l = 0; l < layers; ++l) {
            if (!ready(l) || l == L0)
                continue;
            int inside = 0;
            for (const OffCell& c : off[std::size_t(l)])
                inside += c.token >= begin && c.token < end;
            if (p.layerGroups[std::size_t(l)] == group) {
                ++sameGroup;
                sameGroupHit += inside * 2 >= int(off[std::size_t(l)].size()) && inside > 0;
            } else {
                otherHit += inside > 0 && std::find(affected.begin(), affected.end(), l) != affected.end();
            }
        }
        return otherHit == 0 && (sameGroup == 0 || (sameGroupHit > 0 && sameGroupHit * 2 >= sameGroup));
    };
    // position: decode positions only, from the first one the onset layer holds (a sliding
    // window may have dropped the earliest).
    std::int64_t firstDecode = p.promptLen;
    while (firstDecode < p.tokens && !std::isfinite(ratios.at(L0, firstDecode, 0, KvPart::K)))
        ++firstDecode;
    // Decode only means something where the layer holds clean prefill positions (a sliding
    // window may have dropped them all); else K alone (a rotation) must say it.
    bool cleanPrefillHeld = false;
    for (std::int64_t t = 0; t < p.promptLen && !cleanPrefillHeld; ++t)
        cleanPrefillHeld = std::isfinite(ratios.at(L0, t, 0, KvPart::K));
    const bool fromFirstDecode = s.firstToken >= firstDecode && s.firstToken <= firstDecode + 1 && (cleanPrefillHeld || s.kv == "k");
    // window_edge: nothing before the sequence first fills a sliding window (a layer at or
    // before the onset has one), and then the error, prefill or decode alike.
    auto windowEdge = [&]() -> int {
        if (fromFirstDecode)
            return 0;
        for (int l = 0; l <= L0; ++l) {
            const KvCacheGroup& lg = config.groups[std::size_t(p.layerGroups[std::size_t(l)])];
            if (lg.slidingWindow && s.firstToken >= *lg.slidingWindow - 2 && s.firstToken <= 2 * *lg.slidingWindow)
                return *lg.slidingWindow;
        }
        return 0;
    };
    // tp_rank: the heads are exactly those of some ranks (not all of them).
    auto rankSet = [&]() -> std::vector<int> {
        if (config.tpSize < 2 || allHeads || heads.size() < 2)
            return {};
        std::set<int> ranks;
        for (int h : heads)
            for (int r : config.ranksHolding(h))
                ranks.insert(r);
        std::set<int> held;
        for (int h = 0; h < p.heads; ++h)
            for (int r : config.ranksHolding(h))
                if (ranks.count(r))
                    held.insert(h);
        if (held != std::set<int>(heads.begin(), heads.end()))
            return {};
        return {ranks.begin(), ranks.end()};
    };

    const auto spread = [&] {
        return affected.size() > 1 ? "; later layers follow (" + layerList(s.layers, 1) + ")" : std::string();
    };
    const std::string kvText = s.kv == "kv" ? "K and V" : s.kv == "k" ? "K" : "V";
    const std::string kvVerb = s.kv == "kv" ? " are" : " is";
    if (blockLike()) {
        s.pattern = SuspectPattern::Block;
        s.heads = heads;
        s.blocks = blocksOf(loader, info, group, s.firstToken, s.lastToken);
        std::vector<int> logical, physical;
        for (const SuspectBlock& b : s.blocks)
            logical.push_back(int(b.logical)), physical.push_back(int(b.physical));
        why << kvText << " of every head" << kvVerb << " off the noise floor only at positions " << s.firstToken << "-"
            << s.lastToken << ", group " << group << "'s logical block(s) " << joinInts(logical) << " (physical "
            << joinInts(physical) << "), in " << s.layers.size()
            << " layer(s) of that group and in no other layer: a wrong or overwritten block.";
    } else if (oneHead || heads.size() == 1) {
        s.pattern = SuspectPattern::Head;
        const int h = int(std::max_element(perHead.begin(), perHead.end()) - perHead.begin());
        s.heads = {h};
        why << "Only head " << h << " of " << layer << " is off the noise floor (" << kvText << "), from token "
            << s.firstToken << " (" << s.phase << "): one head computed or stored wrongly" << spread() << ".";
    } else if (const std::vector<int> ranks = rankSet(); !ranks.empty()) {
        s.pattern = SuspectPattern::TpRank;
        s.heads = heads;
        s.tpRanks = ranks;
        why << "Only heads " << joinInts(heads) << " of " << layer << ", the heads TP rank(s) " << joinInts(ranks)
            << " hold, are off the noise floor, at tokens " << s.firstToken << "-" << s.lastToken
            << ": a shard written to or read from the wrong rank" << spread() << ".";
    } else if (const int window = windowEdge(); window > 0) {
        s.pattern = SuspectPattern::WindowEdge;
        s.heads = heads;
        why << "The error starts at token " << s.firstToken << ", where the sequence first fills the sliding window of "
            << window << ", in " << layer << ": the window is off by one" << spread() << ".";
    } else if (fromFirstDecode) {
        s.pattern = SuspectPattern::Position;
        s.heads = heads;
        why << kvText << " of " << (allHeads ? "every head" : "heads " + joinInts(heads)) << " of " << layer
            << kvVerb << " off the noise floor at decode positions only, from the first (token " << s.firstToken
            << "): a RoPE or position offset in decode" << spread() << ".";
    } else {
        s.pattern = SuspectPattern::Layer;
        s.heads = heads;
        // A scale error keeps directions: 1 - cos stays near 0 while L2 is large.
        std::vector<double> cosGap, l2;
        for (const OffCell& c : cells) {
            cosGap.push_back(1.0 - double(p.value(metricFor(c.part, MetricKind::Cos), L0, c.token, c.head)));
            l2.push_back(double(p.value(metricFor(c.part, MetricKind::L2), L0, c.token, c.head)));
        }
        const double medianL2 = median(l2);
        const bool scaleLike = median(cosGap) < 0.1 * medianL2 * medianL2;
        why << kvText << " of " << (allHeads ? "every head" : "heads " + joinInts(heads)) << " of " << layer
            << kvVerb << " off the noise floor at tokens " << s.firstToken << "-" << s.lastToken
            << (scaleLike ? " with their directions kept (1 - cos near 0, relative L2 " : " (relative L2 ")
            << std::setprecision(3) << medianL2 << ")"
            << (scaleLike ? ": a scale error, such as a wrong quantisation scale"
                          : config.tpSize > 1 ? ": the whole layer is wrong (every rank's heads: shards mixed up, or wrong weights)"
                                              : ": the whole layer is wrong")
            << spread() << ".";
    }
    // The onset's tokens, phase and part from the suspect's own heads: stray noise cells in
    // other heads say nothing about it.
    if (!allHeads && !s.heads.empty()) {
        std::int64_t first = p.tokens, last = -1;
        int k = 0, v = 0;
        for (const OffCell& c : cells)
            if (std::find(s.heads.begin(), s.heads.end(), c.head) != s.heads.end()) {
                first = std::min(first, c.token);
                last = std::max(last, c.token);
                (c.part == KvPart::K ? k : v)++;
            }
        s.firstToken = first;
        s.lastToken = last;
        s.phase = last < p.promptLen ? "prefill" : first >= p.promptLen ? "decode" : "both";
        s.kv = v * 10 <= k + v ? "k" : k * 10 <= k + v ? "v" : "kv";
    }
    if (s.tpRanks.empty())
        for (int h : s.heads)
            for (int r : config.ranksHolding(h))
                if (std::find(s.tpRanks.begin(), s.tpRanks.end(), r) == s.tpRanks.end())
                    s.tpRanks.push_back(r);
    std::sort(s.tpRanks.begin(), s.tpRanks.end());
    if (s.blocks.empty())
        s.blocks = blocksOf(loader, info, group, s.firstToken, s.lastToken);
    s.evidence = why.str();
    s.evidencePrompt = p.id;
    return {s};
}

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
            std::sort(q.heads.begin(), q.heads.end());
            std::sort(q.tpRanks.begin(), q.tpRanks.end());
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
            if (s.score > q.score) {
                q.score = s.score;
                q.evidence = s.evidence;
                q.evidencePrompt = s.evidencePrompt;
            }
        }
    std::stable_sort(pooled.begin(), pooled.end(), [](const Suspect& a, const Suspect& b) { return a.score > b.score; });
    return pooled;
}

}  // namespace kvscope
