#include "analysis/structural_evidence.h"


#include <algorithm>
#include <cmath>
#include <map>
#include <sstream>

namespace kvscope {

namespace {

std::string joinNumbers(const std::vector<std::int64_t>& v)
{
    std::string s;
    for (std::size_t i = 0; i < v.size(); ++i)
        s += (i ? ", " : "") + std::to_string(v[i]);
    return s;
}

// n choose k, as a double (the prompts of a capture are few).
double choose(int n, int k)
{
    double c = 1;
    for (int i = 1; i <= k; ++i)
        c = c * double(n - k + i) / double(i);
    return c;
}

const Suspect* finiteOf(const std::vector<Suspect>& suspects)
{
    for (const Suspect& s : suspects)
        if (s.pattern != SuspectPattern::NonFinite)
            return &s;
    return nullptr;
}

// Whether the analysis compared `token` of `layer` (any head's K has a value there).
bool analysedAt(const PromptAnalysis& p, int layer, std::int64_t token)
{
    if (token < 0 || token >= p.tokens)
        return false;
    const Metric linf = metricFor(KvPart::K, MetricKind::Linf);
    for (int h = 0; h < p.headsOf(layer); ++h)
        if (std::isfinite(p.value(linf, layer, token, h)))
            return true;
    return false;
}

}  // namespace

std::optional<StructuralFinding> lastBlockFillOf(const std::vector<PromptSuspects>& prompts, const KvCacheConfig& config,
                                                 const Suspect& pooled)
{
    const int g = config.groupOf(pooled.firstLayer);
    if (g < 0 || pooled.pattern == SuspectPattern::NonFinite)
        return std::nullopt;
    const std::int64_t bs = config.groups[std::size_t(g)].blockSize;
    struct Seen {
        std::int64_t fill;
        bool off;
    };
    std::vector<Seen> seen;
    std::int64_t decode = 0;  // the first decode positions the off prompts share
    for (const PromptSuspects& ps : prompts) {
        const PromptAnalysis& p = *ps.prompt;
        const Suspect* s = finiteOf(*ps.suspects);
        if (s && (s->firstLayer != pooled.firstLayer || s->firstToken != p.promptLen || s->lastToken >= p.promptLen + bs ||
                  s->lastToken >= p.tokens - 1))
            return std::nullopt;  // off elsewhere: the fill does not account for it
        if (s)
            decode = std::max(decode, s->lastToken - p.promptLen + 1);
        seen.push_back({p.promptLen % bs, s != nullptr});
    }
    // A clean prompt counts only where the analysis compared those positions.
    for (std::size_t i = 0; i < prompts.size(); ++i) {
        const PromptAnalysis& p = *prompts[i].prompt;
        if (seen[i].off)
            continue;
        const auto at = std::find(p.layers.begin(), p.layers.end(), pooled.firstLayer);
        if (at == p.layers.end())
            return std::nullopt;
        for (std::int64_t t = p.promptLen; t < p.promptLen + decode; ++t)
            if (!analysedAt(p, int(at - p.layers.begin()), t))
                return std::nullopt;
    }
    std::vector<std::int64_t> offFills, cleanFills;
    for (const Seen& x : seen)
        (x.off ? offFills : cleanFills).push_back(x.fill);
    if (offFills.size() < 2 || cleanFills.size() < 2)
        return std::nullopt;
    std::sort(offFills.begin(), offFills.end());
    std::sort(cleanFills.begin(), cleanFills.end());
    const std::int64_t most = offFills.back();
    if (most >= cleanFills.front())
        return std::nullopt;
    const int n = int(seen.size()), k = int(offFills.size());
    const double chance = 1.0 / choose(n, k);
    if (chance > kStructureChance)
        return std::nullopt;

    StructuralFinding f;
    f.kind = "last_block_fill";
    f.parameters = {{"block_size", double(bs)}, {"max_fill", double(most)}, {"off_prompts", double(k)},
                    {"clean_prompts", double(n - k)}, {"decode_positions", double(decode)}, {"chance", chance}};
    std::vector<std::int64_t> slots;  // the first off position's place inside its block
    for (std::int64_t fill : offFills)
        slots.push_back(fill);
    std::ostringstream text;
    text << "By prompt: off in the first " << decode << " decode position(s) of the " << k << " prompts whose last block was "
         << (2 * most <= bs ? "at most half full" : "at most " + std::to_string(most) + " of " + std::to_string(bs) + " full")
         << " (prompt_len mod " << bs << " = " << joinNumbers(offFills) << "), in none of the " << n - k << " others (mod " << bs
         << " = " << joinNumbers(cleanFills) << "); the first off position sits at slot " << joinNumbers(slots)
         << " of its block; by chance, any " << k << " of the " << n << " prompts split so with chance 1 in "
         << std::lround(1 / chance) << ".";
    f.text = text.str();
    return f;
}

std::optional<StructuralFinding> chunkBoundaryOf(const std::vector<ProvenanceRange>& ranges,
                                                 const std::set<std::int64_t>& off,
                                                 const std::vector<std::int64_t>& analysed, std::int64_t promptLen)
{
    if (off.empty())
        return std::nullopt;
    std::map<std::int64_t, std::pair<std::int64_t, std::int64_t>> chunks;  // chunk -> [start, end)
    for (const ProvenanceRange& r : ranges)
        if (r.kind == ProvenanceKind::Prefill && r.chunk) {
            auto [it, fresh] = chunks.emplace(*r.chunk, std::make_pair(r.start, r.end));
            if (!fresh)
                it->second = {std::min(it->second.first, r.start), std::max(it->second.second, r.end)};
        }
    if (chunks.size() < 2)
        return std::nullopt;
    const std::int64_t first = *off.begin();
    const auto at = std::find_if(chunks.begin(), chunks.end(), [&](const auto& c) { return c.second.first == first; });
    if (at == chunks.end() || at == chunks.begin())
        return std::nullopt;
    std::int64_t before = 0, from = 0, fromOff = 0, prefill = 0, starts = 0;
    for (std::int64_t t : analysed) {
        before += t < first;
        prefill += t < promptLen;
        const ProvenanceRange* r = provenanceAt(ranges, t);
        if (t >= first && r && r->kind == ProvenanceKind::Prefill && r->chunk && *r->chunk >= at->first) {
            ++from;
            fromOff += off.count(t) > 0;
        }
    }
    for (auto c = std::next(chunks.begin()); c != chunks.end(); ++c)
        starts += std::binary_search(analysed.begin(), analysed.end(), c->second.first);
    if (before < 2 || from == 0 || 10 * fromOff < 9 * from || prefill == 0)
        return std::nullopt;
    const double chance = double(starts) / double(prefill);
    if (chance > kStructureChance)
        return std::nullopt;
    const bool decodeToo = *off.rbegin() >= promptLen;

    StructuralFinding f;
    f.kind = "chunk_boundary";
    f.parameters = {{"chunk", double(at->first)},  {"boundary", double(first)}, {"off_from", double(fromOff)},
                    {"analysed_from", double(from)}, {"clean_before", double(before)}, {"chance", chance}};
    std::ostringstream text;
    text << "The error steps at position " << first << ", the first of prefill chunk " << at->first << " (chunks";
    for (const auto& [c, span] : chunks)
        text << (c == chunks.begin()->first ? " " : ", ") << c << ": " << span.first << "-" << span.second - 1;
    text << "): off at " << fromOff << " of the " << from << " positions compared from there"
         << (std::prev(chunks.end())->first > at->first ? " through the later chunks" : " to the chunk's end")
         << (decodeToo ? " (and in the decode)" : "") << ", at none of the " << before
         << " before; an onset at a random prefill position would fall on one of the " << starts
         << " chunk start(s) with chance 1 in " << std::lround(1 / chance) << ".";
    f.text = text.str();
    return f;
}

void addStructuralEvidence(std::vector<Suspect>& pooled, const std::vector<PromptSuspects>& prompts,
                           const KvCacheConfig& config)
{
    const auto top = std::find_if(pooled.begin(), pooled.end(),
                                  [](const Suspect& s) { return s.pattern != SuspectPattern::NonFinite; });
    // (a state-space layer's state has no blocks of positions to fill)
    if (top == pooled.end() || top->structure || top->pattern == SuspectPattern::State)
        return;
    if (std::optional<StructuralFinding> f = lastBlockFillOf(prompts, config, *top)) {
        top->evidence += " " + f->text;
        top->structure = std::move(f);
    }
}

void addStructuralEvidence(std::vector<Suspect>& pooled, const std::vector<PromptAnalysis>& prompts,
                           const KvCacheConfig& config)
{
    std::vector<PromptSuspects> own;
    for (const PromptAnalysis& p : prompts)
        own.push_back({&p, &p.suspects});
    addStructuralEvidence(pooled, own, config);
}

}  // namespace kvscope
