#include "analysis/hypotheses.h"

#include "kv/block_layout.h"
#include "util/short_number.h"
#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <sstream>

namespace kvscope {

namespace {

constexpr std::size_t kMaxCells = 512;     // off cells sampled for every hypothesis
constexpr std::size_t kCoarseCells = 64;   // for a first pass over many candidates
constexpr std::size_t kNearestCells = 24;  // for the nearest-vector search
constexpr std::size_t kNearestPool = 2048; // reference vectors it searches
constexpr std::int64_t kMaxOffset = 4096;    // RoPE position offsets tried, either way
const double kInf = std::numeric_limits<double>::infinity();

std::string joinInts(const std::vector<int>& v)
{
    std::string s;
    for (std::size_t i = 0; i < v.size(); ++i)
        s += (i ? ", " : "") + std::to_string(v[i]);
    return s;
}

// The off cells every hypothesis is tested on: at most kMaxCells, evenly.
std::vector<OffCell> sampledCells(const std::vector<OffCell>& cells)
{
    std::vector<OffCell> sampled;
    const std::size_t stride = std::max<std::size_t>(1, (cells.size() + kMaxCells - 1) / kMaxCells);
    for (std::size_t i = 0; i < cells.size(); i += stride)
        sampled.push_back(cells[i]);
    return sampled;
}

// How far the token-shift hypothesis looks, either way.
int shiftReach(const PromptAnalysis& prompt, const KvCacheConfig& config, int layer)
{
    // A table entry covers block_size positions, times dcp_size under decode context parallelism.
    const int blockSize = int(config.positionsPerEntry(config.groups[std::size_t(prompt.layerGroups[std::size_t(layer)])]));
    return int(std::min<std::int64_t>(std::max(16, 2 * blockSize), std::min<std::int64_t>(64, prompt.tokens - 1)));
}

// The reference vectors the nearest-vector search compares with: evenly over (token, head, part).
struct PoolVector {
    std::int64_t token;
    int head;
    KvPart part;
};
std::vector<PoolVector> nearestPool(std::int64_t seq, int heads)
{
    std::vector<PoolVector> pool;
    const std::int64_t total = seq * heads * 2;
    const std::int64_t stride = std::max<std::int64_t>(1, total / std::int64_t(kNearestPool));
    for (std::int64_t i = 0; i < total; i += stride)
        pool.push_back({i / (2 * heads), int(i / 2 % heads), i % 2 ? KvPart::V : KvPart::K});
    return pool;
}

class Tester {
public:
    explicit Tester(const HypothesisInput& in)
        : m_in(in)
        , m_dims(std::size_t(in.layer) < in.prompt.layerDims.size() ? in.prompt.layerDims[std::size_t(in.layer)] : in.prompt.dims)
        , m_cells(sampledCells(in.cells))
    {
        for (const OffCell& c : m_cells) {
            m_parts.insert(c.part);
            m_heads.insert(c.head);
        }
    }

    const std::vector<OffCell>& cells() const { return m_cells; }
    int dim(KvPart part) const { return m_dims.of(part); }
    std::string name(KvPart part) const { return partTitle(m_in.prompt, part); }
    // The part RoPE turns: K, or an MLA cache's k_pe (its V slot).
    KvPart rotary() const { return m_in.config.isMla() ? KvPart::V : KvPart::K; }
    bool hasPart(KvPart part) const { return m_parts.count(part) > 0; }
    const std::set<int>& heads() const { return m_heads; }

    const float* reference(std::int64_t t, int h, KvPart part) const { return m_in.reference.at(part, t, h); }
    const float* engine(const OffCell& c) const { return m_in.engine.at(c.part, c.token, c.head); }
    double residual(const OffCell& c, const float* predicted) const
    {
        const float* ref = reference(c.token, c.head, c.part);
        const float* stored = engine(c);
        if (!ref || !predicted || !stored)
            return kInf;
        return m_in.ratios.between(m_in.layer, c.token, c.part, ref, predicted, engine(c), dim(c.part));
    }
    // The median residual over `cells` (default: all sampled) of a prediction per cell
    // (`predict` fills `out`, or returns false where it predicts nothing).
    // Also sets share(): the share of those cells within the explained bound.
    double medianResidual(const std::function<bool(const OffCell&, float*)>& predict,
                          const std::vector<OffCell>* subset = nullptr) const
    {
        std::vector<double> r;
        std::vector<float> out(static_cast<std::size_t>(std::max(m_dims.k, m_dims.v)));
        std::size_t within = 0;
        for (const OffCell& c : subset ? *subset : m_cells) {
            r.push_back(predict(c, out.data()) ? residual(c, out.data()) : kInf);
            within += r.back() <= m_in.explained;
        }
        m_share = r.empty() ? 0.0 : double(within) / double(r.size());
        return median(r);
    }
    double share() const { return m_share; }
    double errorBefore() const
    {
        std::vector<double> r;
        for (const OffCell& c : m_cells)
            r.push_back(c.ratio);
        return median(r);
    }

private:
    const HypothesisInput& m_in;
    HeadDims m_dims;
    std::vector<OffCell> m_cells;
    std::set<KvPart> m_parts;
    std::set<int> m_heads;
    mutable double m_share = 0;
};

struct Tried {
    Hypothesis h;
    int complexity = 0;  // on a near tie the simpler explanation wins
};

std::string partsText(const Tester& t)
{
    return t.hasPart(KvPart::K) && t.hasPart(KvPart::V) ? t.name(KvPart::K) + " and " + t.name(KvPart::V)
                                                        : t.name(t.hasPart(KvPart::K) ? KvPart::K : KvPart::V);
}

void tryZeros(const Tester& t, std::vector<Tried>& out)
{
    Hypothesis h{"zeros", {}, partsText(t) + " hold zeros there: never written (or zeroed)", 0, 0};
    h.residualFloors = t.medianResidual([&](const OffCell& c, float* p) {
        std::fill_n(p, t.dim(c.part), 0.0f);
        return true;
    });
    h.explainedShare = t.share();
    out.push_back({h, 0});
}

void tryTokenShift(const Tester& t, const HypothesisInput& in, std::vector<Tried>& out)
{
    const int blockSize = int(in.config.positionsPerEntry(in.config.groups[std::size_t(in.prompt.layerGroups[std::size_t(in.layer)])]));
    const int reach = shiftReach(in.prompt, in.config, in.layer);
    // Every shift on a few cells, the best few on all of them.
    std::vector<OffCell> few;
    for (std::size_t i = 0; i < t.cells().size(); i += std::max<std::size_t>(1, t.cells().size() / kCoarseCells))
        few.push_back(t.cells()[i]);
    const auto byShift = [&](int d, const std::vector<OffCell>* subset) {
        return t.medianResidual([&](const OffCell& c, float* p) {
            const float* src = t.reference(c.token + d, c.head, c.part);
            if (src)
                std::copy_n(src, t.dim(c.part), p);
            return src != nullptr;
        }, subset);
    };
    std::vector<std::pair<double, int>> coarse;  // (-share, shift): most cells explained first
    for (int d = -reach; d <= reach; ++d)
        if (d != 0) {
            byShift(d, &few);
            coarse.push_back({-t.share(), d});
        }
    const std::size_t keep = std::min<std::size_t>(4, coarse.size());
    std::partial_sort(coarse.begin(), coarse.begin() + std::ptrdiff_t(keep), coarse.end());
    double best = kInf, bestShare = 0;
    int bestShift = 0;
    for (std::size_t i = 0; i < keep; ++i) {
        const int d = coarse[i].second;
        const double r = byShift(d, nullptr);
        // The shift that explains the most cells (a shifted table's last block may hold garbage).
        if (t.share() > bestShare || (t.share() == bestShare && r < best))
            best = r, bestShare = t.share(), bestShift = d;
    }
    if (bestShift == 0)
        return;
    std::string text = "token t holds the reference's token t" + std::string(bestShift > 0 ? "+" : "") + std::to_string(bestShift);
    if (std::abs(bestShift) % blockSize == 0)
        text += " (" + std::to_string(std::abs(bestShift) / blockSize) + " whole block(s) of " + std::to_string(blockSize) +
                " " + (bestShift > 0 ? "later" : "earlier") + ": a block table entry off by that much)";
    out.push_back({{"token_shift", {{"offset", double(bestShift)}}, text, best, 0, bestShare}, 1});
}

void tryHeadMap(const Tester& t, const HypothesisInput& in, std::vector<Tried>& out)
{
    const int heads = in.prompt.headsOf(in.layer);
    if (heads < 2)
        return;
    std::map<int, int> mapping;  // actual head -> reference head
    for (int i : t.heads()) {
        std::vector<OffCell> own;
        for (const OffCell& c : t.cells())
            if (c.head == i)
                own.push_back(c);
        double best = kInf;
        int bestJ = -1;
        for (int j = 0; j < heads; ++j) {
            if (j == i)
                continue;
            const double r = t.medianResidual([&](const OffCell& c, float* p) {
                const float* src = t.reference(c.token, j, c.part);
                if (src)
                    std::copy_n(src, t.dim(c.part), p);
                return src != nullptr;
            }, &own);
            if (r < best)
                best = r, bestJ = j;
        }
        mapping[i] = bestJ;
    }
    const double r = t.medianResidual([&](const OffCell& c, float* p) {
        const float* src = t.reference(c.token, mapping.at(c.head), c.part);
        if (src)
            std::copy_n(src, t.dim(c.part), p);
        return src != nullptr;
    });
    Hypothesis h{"head_swap", {}, "", r, 0, t.share()};
    std::string text;
    for (const auto& [i, j] : mapping) {
        h.parameters.push_back({"head_" + std::to_string(i), double(j)});
        text += std::string(text.empty() ? "" : "; ") + "actual head " + std::to_string(i) + " holds reference head " + std::to_string(j);
    }
    // A whole rank's heads holding another rank's, in order: a shard swap.
    const TpLayout layout = in.config.layoutOf(in.prompt.layers[std::size_t(in.layer)]);
    if (layout.tpSize > 1 && layout.mode() == TpMode::Partitioned) {
        const int per = layout.headsPerRank();
        std::map<int, int> rankMap;
        bool ranks = true;
        for (const auto& [i, j] : mapping) {
            ranks = ranks && i % per == j % per;
            auto [it, fresh] = rankMap.emplace(i / per, j / per);
            ranks = ranks && it->second == j / per;
        }
        for (const auto& [a, b] : rankMap) {
            int held = 0;
            for (const auto& [i, j] : mapping)
                held += i / per == a;
            ranks = ranks && held == per;
        }
        if (ranks) {
            h.kind = "rank_swap";
            h.parameters.clear();
            text.clear();
            for (const auto& [a, b] : rankMap) {
                h.parameters.push_back({"rank_" + std::to_string(a), double(b)});
                text += std::string(text.empty() ? "" : "; ") + "TP rank " + std::to_string(a) + " holds rank " +
                        std::to_string(b) + "'s shard";
            }
        }
    }
    h.text = text;
    out.push_back({h, 2});
}

void tryKvSwap(const Tester& t, std::vector<Tried>& out)
{
    if (t.dim(KvPart::K) != t.dim(KvPart::V))
        return;  // MLA's c_kv and k_pe: different widths, never swapped
    const double r = t.medianResidual([&](const OffCell& c, float* p) {
        const float* src = t.reference(c.token, c.head, c.part == KvPart::K ? KvPart::V : KvPart::K);
        if (src)
            std::copy_n(src, t.dim(c.part), p);
        return src != nullptr;
    });
    out.push_back({{"kv_swap", {}, "K holds the reference's V and V its K", r, 0, t.share()}, 1});
}

// The block read in another order than written (kv/block_layout.h): each engine row predicted
// by the reference row the misread puts there, within the rank's block (same logical block,
// the rank's heads). Rows the writing snapshot had not written yet are not predicted (their
// slot held whatever it held); at least half the cells must be predicted.
void tryLayout(const Tester& t, const HypothesisInput& in, std::vector<Tried>& out)
{
    const std::string& layer = in.prompt.layers[std::size_t(in.layer)];
    const int g = in.prompt.layerGroups[std::size_t(in.layer)];
    if (g < 0 || in.config.dcpSize > 1 || in.prompt.headsOf(in.layer) < 1)
        return;  // under DCP a block's rows are not consecutive positions
    const int bs = int(in.config.groups[std::size_t(g)].blockSize);
    const TpLayout tp = in.config.layoutOf(layer);
    const int perRank = tp.mode() == TpMode::Partitioned ? tp.headsPerRank() : 1;
    if (bs < 1 || perRank < 1)
        return;
    const auto writtenUntil = [&](std::int64_t token) -> std::int64_t {
        if (!in.snapshots || in.snapshots->empty())
            return in.reference.seq;
        std::size_t s = 0;
        while (s + 1 < in.snapshots->size() && token >= (*in.snapshots)[s].validatedUntil)
            ++s;
        const std::int64_t len = (*in.snapshots)[s].seqLen();
        return len > 0 ? len : in.reference.seq;
    };
    const bool sameWidth = t.dim(KvPart::K) == t.dim(KvPart::V);
    // Misreads that move every row of this block's shape alike are one hypothesis (with one head
    // a rank, K and V split head-major and token-major are the same bytes): tried once, named
    // with every name it has.
    const std::vector<BlockMisread> misreads = blockMisreads(perRank, bs, sameWidth);
    const auto rowsOf = [&](const BlockMisread& m) {
        std::vector<int> rows;
        for (KvPart part : {KvPart::K, KvPart::V})
            for (int h = 0; h < perRank; ++h)
                for (int r = 0; r < bs; ++r) {
                    const BlockRow from = m.source({part, h, r});
                    rows.push_back(((int(from.part) * perRank + from.head) * bs) + from.row);
                }
        return rows;
    };
    std::vector<std::vector<int>> seen;
    double best = kInf, bestShare = 0;
    const BlockMisread* chosen = nullptr;
    std::vector<int> chosenRows;
    for (const BlockMisread& m : misreads) {
        if (m.writtenAs == "k_v")
            continue;  // kv_swap says it
        std::vector<int> rows = rowsOf(m);
        if (std::find(seen.begin(), seen.end(), rows) != seen.end())
            continue;
        seen.push_back(rows);
        std::vector<double> r;
        std::size_t within = 0, identity = 0;
        for (const OffCell& c : t.cells()) {
            const std::int64_t e = c.token / bs;
            const BlockRow from = m.source({c.part, c.head, int(c.token - e * bs)});
            if (from.part == c.part && from.head == c.head && from.row == int(c.token - e * bs))
                ++identity;  // read where written: this misread moves nothing there
            const std::int64_t token = e * bs + from.row;
            if (token >= writtenUntil(c.token) || from.head >= in.reference.heads)
                continue;
            const float* src = t.reference(token, from.head, from.part);
            if (!src || t.dim(from.part) != t.dim(c.part))
                continue;
            r.push_back(t.residual(c, src));
            within += r.back() <= in.explained;
        }
        if (identity * 2 > t.cells().size() || r.size() * 2 < t.cells().size())
            continue;
        const double res = median(r);
        if (res < best)
            best = res, bestShare = double(within) / double(t.cells().size()), chosen = &m, chosenRows = rows;
    }
    if (!chosen)
        return;
    std::string same;
    for (const BlockMisread& m : misreads)
        if (&m != chosen && m.writtenAs != "k_v" && rowsOf(m) == chosenRows)
            same += (same.empty() ? "" : ", ") + m.writtenAs + "/" + m.readAs;
    Hypothesis h{"layout", {{"block_size", double(bs)}, {"heads_per_rank", double(perRank)}}, "", best, 0, bestShare};
    h.labels = {{"written_as", chosen->writtenAs}, {"read_as", chosen->readAs}};
    if (!same.empty())
        h.labels.push_back({"same_bytes_as", same});
    h.text = "each TP rank's block (" + std::to_string(perRank) + " head(s) x " + std::to_string(bs) +
             " rows) was written " + chosen->writtenAs + " and read " + chosen->readAs +
             (same.empty() ? std::string() : " (at this shape the same bytes as " + same + ")") +
             ": the reference laid out that way and read the other way gives the engine's values";
    out.push_back({h, 2});
}

void tryScale(const Tester& t, const HypothesisInput& in, std::vector<Tried>& out)
{
    // The least-squares factor per (head, part): sum(a r) / sum(r r).
    std::map<std::pair<int, int>, std::pair<double, double>> sums;
    for (const OffCell& c : t.cells()) {
        const float* r = t.reference(c.token, c.head, c.part);
        const float* a = t.engine(c);
        if (!r || !a)
            continue;
        auto& [ar, rr] = sums[{c.head, int(c.part)}];
        for (int i = 0; i < t.dim(c.part); ++i)
            ar += double(a[i]) * r[i], rr += double(r[i]) * r[i];
    }
    std::map<std::pair<int, int>, double> factor;
    std::vector<double> all;
    for (const auto& [key, s] : sums) {
        factor[key] = s.second > 0 ? s.first / s.second : 0;
        all.push_back(factor[key]);
    }
    if (all.empty())
        return;
    const double r = t.medianResidual([&](const OffCell& c, float* p) {
        const float* src = t.reference(c.token, c.head, c.part);
        if (!src)
            return false;
        const double f = factor.at({c.head, int(c.part)});
        for (int i = 0; i < t.dim(c.part); ++i)
            p[i] = float(f * src[i]);
        return true;
    });
    const double lo = *std::min_element(all.begin(), all.end()), hi = *std::max_element(all.begin(), all.end());
    const double typical = median(all);
    std::vector<int> heads(t.heads().begin(), t.heads().end());
    std::string who = partsText(t) + (in.prompt.headsOf(in.layer) == 1 ? std::string()  // one latent: no heads to name
                                      : int(heads.size()) == in.prompt.headsOf(in.layer) ? std::string(" of every head")
                                                                             : " of head(s) " + joinInts(heads));
    std::set<int> ranks;
    for (int h : heads)
        for (int rank : in.config.layoutOf(in.prompt.layers[std::size_t(in.layer)]).ranksHolding(h))
            ranks.insert(rank);
    if (in.config.tpSize > 1 && int(ranks.size()) < in.config.tpSize && !ranks.empty())
        who += " (TP rank(s) " + joinInts(std::vector<int>(ranks.begin(), ranks.end())) + ")";
    Hypothesis h{"scale", {{"factor", typical}, {"min", lo}, {"max", hi}}, "", r, 0, t.share()};
    h.text = hi - lo <= 0.03 * std::fabs(typical) ? who + " is " + shortNumber(typical) + "x the reference"
                                                    : who + " scaled by " + shortNumber(lo) + "-" + shortNumber(hi) + "x the reference";
    out.push_back({h, 3});
}

// A quantised cache decoded with other scales than it was quantised with: its stored scale off
// by a factor, one scale for every head where the bundle declares one per head, or another
// layer's scale. Each predicts the engine's values exactly: the reference quantised with the
// scale it was encoded with (saturation included), decoded with the declared one.
void tryCacheScales(const Tester& t, const HypothesisInput& in, std::vector<Tried>& out)
{
    const PromptAnalysis& p = in.prompt;
    const std::size_t layer = std::size_t(in.layer);
    if (layer >= p.cacheScales.size() || !isQuantised(p.layerDtypes[layer]))
        return;
    const CacheScales& declared = p.cacheScales[layer];
    const std::size_t heads = std::size_t(p.headsOf(in.layer));
    if (declared.heads[0].size() != heads || declared.heads[1].size() != heads)
        return;  // per token and head: a factor is all the generic scale can say
    const DType dtype = p.layerDtypes[layer];
    const auto scaleOf = [&](int head, KvPart part) { return double(declared.heads[std::size_t(part)][std::size_t(head)]); };
    // How far off each (head, part) is: the median ratio over its large elements.
    std::map<std::pair<int, int>, std::vector<double>> ratios;
    for (const OffCell& c : t.cells()) {
        const float* r = t.reference(c.token, c.head, c.part);
        const float* a = t.engine(c);
        if (!r || !a)
            continue;
        float largest = 0;
        for (int i = 0; i < t.dim(c.part); ++i)
            largest = std::max(largest, std::fabs(r[i]));
        for (int i = 0; i < t.dim(c.part); ++i)
            if (std::fabs(r[i]) > 0.25f * largest && largest > 0)
                ratios[{c.head, int(c.part)}].push_back(double(a[i]) / double(r[i]));
    }
    std::map<std::pair<int, int>, double> factor;
    std::vector<double> all;
    for (auto& [key, r] : ratios)
        if (const double f = median(r); f > 0 && std::isfinite(f))
            factor[key] = f, all.push_back(f);
    if (all.empty())
        return;
    // The residual of "quantised with encodedWith(head, part), decoded with the declared scale".
    const auto residualWith = [&](const std::function<double(int, KvPart)>& encodedWith) {
        return t.medianResidual([&](const OffCell& c, float* predicted) {
            const float* src = t.reference(c.token, c.head, c.part);
            const double encoded = encodedWith(c.head, c.part);
            if (!src || !(encoded > 0))
                return false;
            const float declaredScale = float(scaleOf(c.head, c.part));
            for (int i = 0; i < t.dim(c.part); ++i)
                predicted[i] = roundToDType(dtype, float(src[i] / encoded)) * declaredScale;
            return true;
        });
    };
    const std::string parts = partsText(t);
    const std::string format = dtypeName(dtype);


    if (declared.granularity == ScaleGranularity::Head) {
        // One scale for the tensor: per part, the median of what each head was encoded with.
        std::map<int, double> common;
        for (KvPart part : {KvPart::K, KvPart::V}) {
            std::vector<double> encoded;
            for (const auto& [key, fh] : factor)
                if (key.second == int(part))
                    encoded.push_back(scaleOf(key.first, part) / fh);
            common[int(part)] = encoded.empty() ? 0 : median(encoded);
        }
        Hypothesis granularity{"scale_granularity", {{"k_scale", common[0]}, {"v_scale", common[1]}}, "",
                               residualWith([&](int, KvPart part) { return common.at(int(part)); }), 0, t.share()};
        granularity.text = parts + " quantised with one scale for every head, decoded with the per-head scales the "
                                   "bundle declares";
        out.push_back({granularity, 0});  // it also says why the other heads are right
    }
    if (declared.granularity == ScaleGranularity::Tensor) {
        // Another layer's scale (per tensor).
        double best = kInf;
        std::size_t bestLayer = layer;
        double share = 0;
        for (std::size_t other = 0; other < p.cacheScales.size(); ++other) {
            const CacheScales& o = p.cacheScales[other];
            if (other == layer || o.granularity != ScaleGranularity::Tensor || o.heads[0].empty() || o.heads[1].empty())
                continue;
            const double r = residualWith([&](int, KvPart part) { return double(o.heads[std::size_t(part)][0]); });
            if (r < best)
                best = r, bestLayer = other, share = t.share();
        }
        if (bestLayer != layer) {
            const CacheScales& o = p.cacheScales[bestLayer];
            Hypothesis otherLayer{"scale_other_layer", {{"layer", double(bestLayer)}}, "", best, 0, share};
            otherLayer.text = parts + " quantised with the scale of " + p.layers[bestLayer] + " (K " +
                              shortNumber(o.heads[0][0]) + ", V " + shortNumber(o.heads[1][0]) + "), decoded with its own (K " +
                              shortNumber(scaleOf(0, KvPart::K)) + ", V " + shortNumber(scaleOf(0, KvPart::V)) + ")";
            out.push_back({otherLayer, 1});
        }
    }
    // The same factor everywhere. Tried last: on a tie with another layer's scale, that one (a
    // named scale, not a fitted one), unless the factor is a power of two (a unit mix-up, the
    // simplest explanation of all).
    const double f = median(all);
    Hypothesis offBy{"cache_scale", {{"factor", f}}, "", residualWith([&](int h, KvPart part) { return scaleOf(h, part) / f; }),
                     0, t.share()};
    offBy.text = "the " + format + " cache's " + parts + " scale is " + shortNumber(f) +
                 "x the scale its values were quantised with";
    const double octaves = std::log2(f);
    out.push_back({offBy, std::fabs(octaves - std::round(octaves)) < 0.02 && std::round(octaves) != 0 ? 0 : 1});
}

// A model with a scaling beyond linear rotated another way an engine may: without the scaling
// (rope_scaling not read; vLLM's dynamic NTK, whose base at max_position * factor comes out as
// the model's own), and for longrope the long factors where HF takes the short ones (vLLM takes
// them whenever max_model_len exceeds original_max_position_embeddings). None for the others.
void tryRopeScalingTypes(const RopeSettings& model, const std::string& rotated, std::int64_t length,
                         const std::function<double(const RopeSettings&)>& predict, const std::function<double()>& share,
                         std::vector<Tried>& out)
{
    const RopeScaling& s = model.scaling;
    if (s.type == RopeScalingType::Default)
        return;
    const std::string type = ropeScalingName(s.type);
    RopeSettings unscaled = model;
    unscaled.scaling = RopeScaling{};
    unscaled.scaling.mropeSection = s.mropeSection;
    const double r = predict(unscaled);
    out.push_back({{"rope_unscaled", {},
                    rotated + " rotated without the model's " + type + " RoPE scaling" +
                        (s.type == RopeScalingType::Dynamic ? " (as vLLM's dynamic NTK rotates: its base stays the model's)"
                                                            : " (an engine that ignores rope_scaling)"),
                    r, 0, share()}, 1});
    if (s.type == RopeScalingType::LongRope && double(length) <= s.originalMaxPositions) {
        RopeSettings longer = model;
        longer.scaling.shortFactor = s.longFactor;
        const double rl = predict(longer);
        out.push_back({{"rope_long_factors", {},
                        rotated + " rotated with longrope's long factors where HF uses the short ones for " +
                            std::to_string(length) + " tokens (vLLM uses the long ones whenever max_model_len exceeds " +
                            shortNumber(s.originalMaxPositions, 6) + ")",
                        rl, 0, share()}, 1});
    }
}

// The engine rotating in the other pair convention.
Tried ropeConvention(const RopeSettings& model, const std::string& rotated,
                     const std::function<double(const RopeSettings&)>& predict, const std::function<double()>& share)
{
    RopeSettings other = model;
    other.neoxStyle = !model.neoxStyle;
    const double r = predict(other);
    return {{"rope_convention", {},
             rotated + " rotated in the other pair convention (" + (other.neoxStyle ? "rotated halves" : "interleaved pairs") +
                 " where the model uses " + (model.neoxStyle ? "rotated halves" : "interleaved pairs") + ")",
             r, 0, share()}, 1};
}

void tryRope(const Tester& t, const HypothesisInput& in, std::vector<Tried>& out)
{
    const KvPart rotary = t.rotary();
    if (!in.rope || !t.hasPart(rotary))
        return;
    const RopeSettings model = *in.rope;
    const int dim = t.dim(rotary);
    const std::string rotated = t.name(rotary);
    std::vector<double> given(static_cast<std::size_t>(dim)), turned(static_cast<std::size_t>(dim)),
        raw(static_cast<std::size_t>(dim));
    // The engine's rotary part predicted by `rotate` applied to the reference's; the other unchanged.
    using Rotate = std::function<void(const OffCell&, const double*, double*)>;
    const auto kRotated = [&](const Rotate& rotate, const std::vector<OffCell>* subset = nullptr) {
        return t.medianResidual([&](const OffCell& c, float* p) {
            const float* src = t.reference(c.token, c.head, c.part);
            if (!src)
                return false;
            if (c.part != rotary) {
                std::copy_n(src, t.dim(c.part), p);
                return true;
            }
            std::copy_n(src, dim, given.begin());
            rotate(c, given.data(), turned.data());
            for (int i = 0; i < dim; ++i)
                p[i] = float(turned[std::size_t(i)]);
            return true;
        }, subset);
    };
    // Un-rotated under the model's settings, rotated again at position(t) under `engine`.
    // The reference is HF's forward over the whole sequence, whose length dynamic NTK and longrope read.
    const std::int64_t length = in.prompt.tokens;
    RopeRotation undo(model, dim, length);
    auto predict = [&](const RopeSettings& engine, const std::function<double(std::int64_t)>& position) {
        RopeRotation redo(engine, dim, length);
        return kRotated([&](const OffCell& c, const double* from, double* to) {
            undo.setPosition(double(c.token), true);
            undo.apply(from, raw.data());
            redo.setPosition(position(c.token));
            redo.apply(raw.data(), to);
        });
    };
    // Position offsets d: K rotated for t + d is the reference's K rotated by d more (rotations
    // of one RoPE compose). Every d within the sequence (up to kMaxOffset) is tried on a few
    // cells, the best few on all of them.
    std::vector<OffCell> few;
    for (const OffCell& c : t.cells())
        if (c.part == rotary && few.size() < 16)
            few.push_back(c);
    RopeRotation turn(model, dim, length);
    const auto byOffset = [&](std::int64_t d, const std::vector<OffCell>* subset) {
        turn.setTurn(double(d));
        return kRotated([&](const OffCell&, const double* from, double* to) { turn.apply(from, to); }, subset);
    };
    const std::int64_t reach = std::min<std::int64_t>(in.prompt.tokens, kMaxOffset);
    std::vector<std::pair<double, std::int64_t>> coarse;
    for (std::int64_t d = -reach; d <= reach; ++d)
        if (d != 0)
            coarse.push_back({byOffset(d, &few), d});
    const std::size_t keep = std::min<std::size_t>(8, coarse.size());
    std::partial_sort(coarse.begin(), coarse.begin() + std::ptrdiff_t(keep), coarse.end());
    double best = kInf, bestShare = 0;
    std::int64_t bestOffset = 0;
    for (std::size_t i = 0; i < keep; ++i) {
        const double r = byOffset(coarse[i].second, nullptr);
        if (r < best)
            best = r, bestOffset = coarse[i].second, bestShare = t.share();
    }
    const auto same = [](std::int64_t token) { return double(token); };
    const std::string offsetText = rotated + " rotated for position " + std::string(bestOffset > 0 ? "+" : "") +
                                   std::to_string(bestOffset) +
                                   (bestOffset < -8 ? " (positions restarted " + std::to_string(-bestOffset) +
                                                          " tokens in, as a chunked prefill that resets them would)"
                                                    : " (a position offset)");
    out.push_back({{"rope_offset", {{"offset", double(bestOffset)}}, offsetText, best, 0, bestShare}, 1});

    const auto bySame = [&](const RopeSettings& engine) { return predict(engine, same); };
    out.push_back(ropeConvention(model, rotated, bySame, [&] { return t.share(); }));

    // One setting changed over candidate values (the model's own left out): the best value,
    // its residual and share; none when every candidate is the model's.
    struct Variant {
        double value = 0, residual = kInf, share = 0;
    };
    const auto bestVariant = [&](const std::vector<double>& values, double own,
                                 const std::function<void(RopeSettings&, double)>& set) {
        std::optional<Variant> best;
        for (double v : values) {
            if (std::fabs(v - own) <= 1e-6 * std::fabs(own))
                continue;
            RopeSettings engine = model;
            set(engine, v);
            if (const double r = predict(engine, same); !best || r < best->residual)
                best = Variant{v, r, t.share()};
        }
        return best;
    };
    if (const auto b = bestVariant({1e4, 5e4, 1e5, 5e5, 1e6, 1e7}, model.theta,
                                   [](RopeSettings& r, double v) { r.theta = v; }))
        out.push_back({{"rope_base", {{"theta", b->value}},
                        rotated + " rotated with base " + shortNumber(b->value, 6) + " where the model's is " + shortNumber(model.theta, 6),
                        b->residual, 0, b->share}, 1});
    if (const auto b = bestVariant({0.25, 0.5, 1.0, 2.0, 4.0, 8.0}, model.positionScale,
                                   [](RopeSettings& r, double v) { r.positionScale = v; }))
        out.push_back({{"rope_scaling", {{"factor", b->value}},
                        rotated + " rotated with positions divided by " + shortNumber(b->value) + " where the model divides by " +
                            shortNumber(model.positionScale),
                        b->residual, 0, b->share}, 1});
    const int modelDims = model.rotaryDim > 0 ? model.rotaryDim : dim;
    std::vector<double> dims;  // all, half, a quarter: even counts of at least 2
    for (int d : {dim, dim / 2, dim / 4})
        if (d >= 2 && d % 2 == 0)
            dims.push_back(d);
    if (const auto b = bestVariant(dims, modelDims, [](RopeSettings& r, double v) { r.rotaryDim = int(v); }))
        out.push_back({{"rope_dims", {{"rotary_dims", b->value}},
                        rotated + " rotated over " + std::to_string(int(b->value)) + " dims where the model rotates " +
                            std::to_string(modelDims),
                        b->residual, 0, b->share}, 1});
    tryRopeScalingTypes(model, rotated, length, bySame, [&] { return t.share(); }, out);
}

// Magnitude faults with the direction intact, each a fit with free parameters: tried only when
// no exact hypothesis explains the error (testHypotheses), and offered only when the fitted
// model explains it outright (median residual within the bound and three quarters of the cells
// back near the floor) with far more values than parameters, so that a fit cannot absorb an
// unrelated fault. Nothing is added to `out` otherwise: a free fit is never a nearest or an
// explanation in part.
constexpr double kFreeFitShare = 0.75;  // the cells a free fit must bring back near the floor
constexpr int kFreeFitCells = 8;       // cells per fitted vector (a channel factor, a bias) at least

bool freeFitHolds(const Tester& t, double residual, const HypothesisInput& in)
{
    return residual <= in.explained && t.share() >= kFreeFitShare;
}

// What a fit shared by the tokens is fitted on: every (head, part) with an off cell, at every
// token with one (its vectors are read for each head), off or not there: a constant vector or
// factor holds at every token, and more tokens than the off ones leave fewer free parameters a
// value.
std::vector<OffCell> sharedFitCells(const Tester& t)
{
    std::set<std::int64_t> tokens;
    std::set<std::pair<int, int>> groups;
    for (const OffCell& c : t.cells()) {
        tokens.insert(c.token);
        groups.insert({c.head, int(c.part)});
    }
    std::vector<OffCell> cells;
    for (const auto& [head, part] : groups)
        for (std::int64_t token : tokens) {
            const OffCell c{token, head, KvPart(part), 0.0f};
            if (t.reference(token, head, KvPart(part)) && t.engine(c))
                cells.push_back(c);
        }
    return cells;
}

std::string headsText(const HypothesisInput& in, const std::set<int>& heads)
{
    if (in.prompt.headsOf(in.layer) == 1)
        return {};
    if (int(heads.size()) == in.prompt.headsOf(in.layer))
        return " of every head";
    return " of head(s) " + joinInts(std::vector<int>(heads.begin(), heads.end()));
}

// A least-squares factor per (token, part), shared by the heads: K normalised over the wrong
// axis, a scale read from another token's slot. The direction of every cell must be kept.
void tryTokenScale(const Tester& t, const HypothesisInput& in, std::vector<Tried>& out)
{
    std::map<std::pair<std::int64_t, int>, std::pair<double, double>> sums;
    for (const OffCell& c : t.cells()) {
        const float* r = t.reference(c.token, c.head, c.part);
        const float* a = t.engine(c);
        if (!r || !a)
            continue;
        auto& [ar, rr] = sums[{c.token, int(c.part)}];
        for (int i = 0; i < t.dim(c.part); ++i)
            ar += double(a[i]) * r[i], rr += double(r[i]) * r[i];
    }
    std::set<std::int64_t> tokens;
    std::map<std::pair<std::int64_t, int>, double> factor;
    for (const auto& [key, s] : sums)
        if (s.second > 0) {
            factor[key] = s.first / s.second;
            tokens.insert(key.first);
        }
    // Several tokens, and a direction of several dims left to check in every cell.
    if (tokens.size() < 3 || int(t.cells().size()) < kFreeFitCells || std::min(t.dim(KvPart::K), t.dim(KvPart::V)) < 8)
        return;
    const double r = t.medianResidual([&](const OffCell& c, float* p) {
        const float* src = t.reference(c.token, c.head, c.part);
        const auto f = factor.find({c.token, int(c.part)});
        if (!src || f == factor.end())
            return false;
        for (int i = 0; i < t.dim(c.part); ++i)
            p[i] = float(f->second * src[i]);
        return true;
    });
    if (!freeFitHolds(t, r, in))
        return;
    double lo = kInf, hi = -kInf;
    for (const auto& [key, f] : factor)
        lo = std::min(lo, f), hi = std::max(hi, f);
    out.push_back({{"token_scale", {{"min", lo}, {"max", hi}, {"tokens", double(tokens.size())}},
                    partsText(t) + headsText(in, t.heads()) + " scaled by a factor that varies by token (" +
                        shortNumber(lo) + "-" + shortNumber(hi) + "x)",
                    r, 0, t.share()}, 5});
}

// A factor per channel of each head and part, the same at every token.
void tryChannelScale(const Tester& t, const HypothesisInput& in, std::vector<Tried>& out)
{
    std::map<std::pair<int, int>, std::vector<std::pair<double, double>>> sums;  // (head, part) -> per channel
    std::map<std::pair<int, int>, int> count;
    for (const OffCell& c : sharedFitCells(t)) {
        const float* r = t.reference(c.token, c.head, c.part);
        const float* a = t.engine(c);
        auto& s = sums[{c.head, int(c.part)}];
        s.resize(std::size_t(t.dim(c.part)));
        for (int i = 0; i < t.dim(c.part); ++i)
            s[std::size_t(i)].first += double(a[i]) * r[i], s[std::size_t(i)].second += double(r[i]) * r[i];
        ++count[{c.head, int(c.part)}];
    }
    if (sums.empty())
        return;
    for (const auto& [key, n] : count)
        if (n < kFreeFitCells)
            return;  // each channel's factor from kFreeFitCells tokens at least
    std::map<std::pair<int, int>, std::vector<double>> factor;
    double lo = kInf, hi = -kInf;
    for (const auto& [key, s] : sums)
        for (const auto& [ar, rr] : s) {
            factor[key].push_back(rr > 0 ? ar / rr : 1.0);
            lo = std::min(lo, factor[key].back()), hi = std::max(hi, factor[key].back());
        }
    const double r = t.medianResidual([&](const OffCell& c, float* p) {
        const float* src = t.reference(c.token, c.head, c.part);
        if (!src)
            return false;
        const std::vector<double>& f = factor.at({c.head, int(c.part)});
        for (int i = 0; i < t.dim(c.part); ++i)
            p[i] = float(f[std::size_t(i)] * src[i]);
        return true;
    });
    if (!freeFitHolds(t, r, in))
        return;
    out.push_back({{"channel_scale", {{"min", lo}, {"max", hi}},
                    partsText(t) + headsText(in, t.heads()) + " scaled by a factor per channel (" + shortNumber(lo) + "-" +
                        shortNumber(hi) + "x), the same at every token",
                    r, 0, t.share()}, 5});
}

// A constant vector per head and part added before RoPE (a dropped or extra qkv bias): fitted
// on the un-rotated vectors (the bundle's RoPE) for the rotary part, directly for the other
// (and for the rotary part too when the bundle has no RoPE).
void tryBias(const Tester& t, const HypothesisInput& in, std::vector<Tried>& out)
{
    const KvPart rotary = t.rotary();
    const std::int64_t length = in.prompt.tokens;
    std::optional<RopeRotation> rope;
    if (in.rope)
        rope.emplace(*in.rope, t.dim(rotary), length);
    std::vector<double> from(std::size_t(std::max(t.dim(KvPart::K), t.dim(KvPart::V)))), to(from.size()), back(from.size());
    // The vector as RoPE found it: un-rotated for the rotary part.
    const auto unrotated = [&](const OffCell& c, const float* x, double* y) {
        std::copy_n(x, t.dim(c.part), from.begin());
        if (rope && c.part == rotary) {
            rope->setPosition(double(c.token), true);
            rope->apply(from.data(), y);
        } else
            std::copy_n(from.begin(), t.dim(c.part), y);
    };
    std::map<std::pair<int, int>, std::vector<double>> bias;
    std::map<std::pair<int, int>, int> count;
    for (const OffCell& c : sharedFitCells(t)) {
        const float* r = t.reference(c.token, c.head, c.part);
        const float* a = t.engine(c);
        auto& b = bias[{c.head, int(c.part)}];
        b.resize(std::size_t(t.dim(c.part)));
        unrotated(c, a, to.data());
        unrotated(c, r, back.data());
        for (int i = 0; i < t.dim(c.part); ++i)
            b[std::size_t(i)] += to[std::size_t(i)] - back[std::size_t(i)];
        ++count[{c.head, int(c.part)}];
    }
    if (bias.empty())
        return;
    double norm = 0;
    for (auto& [key, b] : bias) {
        const int n = count.at(key);
        if (n < kFreeFitCells)
            return;  // head_dim values fitted from kFreeFitCells tokens at least
        double sq = 0;
        for (double& x : b)
            x /= n, sq += x * x;
        norm = std::max(norm, std::sqrt(sq));
    }
    const double r = t.medianResidual([&](const OffCell& c, float* p) {
        const float* src = t.reference(c.token, c.head, c.part);
        if (!src)
            return false;
        const std::vector<double>& b = bias.at({c.head, int(c.part)});
        unrotated(c, src, back.data());
        for (int i = 0; i < t.dim(c.part); ++i)
            back[std::size_t(i)] += b[std::size_t(i)];
        if (rope && c.part == rotary) {
            rope->setPosition(double(c.token));
            rope->apply(back.data(), to.data());
        } else
            std::copy_n(back.begin(), t.dim(c.part), to.begin());
        for (int i = 0; i < t.dim(c.part); ++i)
            p[i] = float(to[std::size_t(i)]);
        return true;
    });
    if (!freeFitHolds(t, r, in))
        return;
    const bool beforeRope = rope && t.hasPart(rotary);
    out.push_back({{"bias", {{"norm", norm}},
                    partsText(t) + headsText(in, t.heads()) + " plus a constant bias" +
                        (beforeRope ? " added before RoPE" : "") + " (norm " + shortNumber(norm) + "): a dropped or extra qkv bias",
                    r, 0, t.share()}, 5});
}

// Values clipped at a bound (a cast without a scale): the bound where the engine's values pile
// up (the commonest |value| among those smaller than the reference's), per part; predicted as
// the reference clamped to it.
void tryClipped(const Tester& t, const HypothesisInput& in, std::vector<Tried>& out)
{
    std::map<int, std::map<float, int>> piled;  // part -> |engine value| -> count, where the reference is larger
    std::map<int, int> values;
    for (const OffCell& c : t.cells()) {
        const float* r = t.reference(c.token, c.head, c.part);
        const float* a = t.engine(c);
        if (!r || !a)
            continue;
        for (int i = 0; i < t.dim(c.part); ++i) {
            ++values[int(c.part)];
            if (std::fabs(r[i]) > std::fabs(a[i]) && a[i] != 0 && (a[i] > 0) == (r[i] > 0))
                ++piled[int(c.part)][std::fabs(a[i])];
        }
    }
    std::map<int, float> bound;
    for (const auto& [part, counts] : piled) {
        const auto most = std::max_element(counts.begin(), counts.end(),
                                           [](const auto& x, const auto& y) { return x.second < y.second; });
        // A pile: at least 8 values at that one magnitude, and a hundredth of the part's values.
        if (most->second < 8 || most->second * 100 < values.at(part))
            return;
        bound[part] = most->first;
    }
    if (bound.size() != values.size())
        return;
    const double r = t.medianResidual([&](const OffCell& c, float* p) {
        const float* src = t.reference(c.token, c.head, c.part);
        if (!src)
            return false;
        const float b = bound.at(int(c.part));
        for (int i = 0; i < t.dim(c.part); ++i)
            p[i] = std::clamp(src[i], -b, b);
        return true;
    });
    if (!freeFitHolds(t, r, in))
        return;
    Hypothesis h{"clipped", {}, "", r, 0, t.share()};
    std::string text;
    for (const auto& [part, b] : bound) {
        h.parameters.push_back({bound.size() == 1 ? std::string("bound") : std::string(kvPartName(KvPart(part))) + "_bound", double(b)});
        text += (text.empty() ? "" : ", ") + t.name(KvPart(part)) + headsText(in, t.heads()) + " clipped at ±" +
                shortNumber(b);
    }
    h.text = text + " (a cast without a scale)";
    out.push_back({h, 3});
}

void tryNearest(const Tester& t, const HypothesisInput& in, std::vector<Tried>& out)
{
    // The reference layer's vectors, evenly sampled (those present).
    std::vector<PoolVector> pool;
    for (const PoolVector& v : nearestPool(in.reference.seq, in.reference.heads))
        if (t.reference(v.token, v.head, v.part))
            pool.push_back(v);
    if (pool.empty())
        return;
    std::vector<double> nearest;
    const std::size_t step = std::max<std::size_t>(1, t.cells().size() / kNearestCells);
    for (std::size_t i = 0; i < t.cells().size(); i += step) {
        const OffCell& c = t.cells()[i];
        double best = kInf;
        for (const PoolVector& v : pool)
            if (!(v.token == c.token && v.head == c.head && v.part == c.part) && t.dim(v.part) == t.dim(c.part))
                best = std::min(best, t.residual(c, t.reference(v.token, v.head, v.part)));
        nearest.push_back(best);
    }
    const double r = median(nearest);
    const double near = double(std::count_if(nearest.begin(), nearest.end(), [&](double x) { return x <= in.explained; })) /
                        double(nearest.size());
    if (r <= in.explained)
        out.push_back({{"misplaced", {}, "each engine vector is another vector of the reference layer, though not by one "
                                         "token shift or head map: data written to the wrong place", r, 0, near}, 4});
    else
        out.push_back({{"unrelated", {{"nearest_floors", r}},
                        "no vector of the reference layer (any token, head, K or V) is near the engine's: stale data, or "
                        "another sequence's", r, 0, 1.0 - near}, 4});
}

}  // namespace

HypothesisPositions hypothesisPositions(const PromptAnalysis& prompt, const KvCacheConfig& config, int layer,
                                        const std::vector<OffCell>& cells, std::int64_t seq, int heads)
{
    HypothesisPositions positions;
    const int reach = shiftReach(prompt, config, layer);
    for (const OffCell& c : sampledCells(cells)) {
        positions.engine.push_back(c.token);
        for (std::int64_t d = -reach; d <= reach; ++d)
            positions.reference.push_back(c.token + d);
    }
    for (const PoolVector& v : nearestPool(seq, heads))
        positions.reference.push_back(v.token);
    return positions;
}

bool clearlyLowers(const Hypothesis& h, double cleanLevel)
{
    return h.residualFloors <= cleanLevel + (1 - kLeadShare) * (h.errorFloors - cleanLevel);
}

std::vector<Hypothesis> testHypotheses(const HypothesisInput& in)
{
    if (in.cells.empty())
        return {};
    const Tester t(in);
    std::vector<Tried> tried;
    tryZeros(t, tried);
    tryTokenShift(t, in, tried);
    tryHeadMap(t, in, tried);
    tryKvSwap(t, tried);
    tryLayout(t, in, tried);
    tryScale(t, in, tried);
    tryCacheScales(t, in, tried);
    tryRope(t, in, tried);
    tryNearest(t, in, tried);
    // The free fits (magnitude with the direction intact) only when nothing exact explains.
    if (std::none_of(tried.begin(), tried.end(), [&](const Tried& x) { return x.h.residualFloors <= in.explained; })) {
        tryClipped(t, in, tried);
        tryTokenScale(t, in, tried);
        tryChannelScale(t, in, tried);
        tryBias(t, in, tried);
    }
    const double before = t.errorBefore();
    // Best first; on a near tie (an eighth of the explained bound a step of complexity:
    // a quarter floor three-way), the simpler one.
    const double step = in.explained / 8;
    std::stable_sort(tried.begin(), tried.end(), [step](const Tried& a, const Tried& b) {
        return a.h.residualFloors + step * a.complexity < b.h.residualFloors + step * b.complexity;
    });
    // The catch-alls (misplaced, unrelated) only when no specific one explains the error.
    const auto generic = [](const Tried& x) { return x.h.kind == "misplaced" || x.h.kind == "unrelated"; };
    const auto specific = std::find_if(tried.begin(), tried.end(), [&](const Tried& x) {
        return !generic(x) && x.h.residualFloors <= in.explained;
    });
    if (specific != tried.end())
        std::rotate(tried.begin(), specific, specific + 1);
    std::vector<Hypothesis> result;
    for (Tried& x : tried) {
        x.h.errorFloors = before;
        result.push_back(std::move(x.h));
    }
    return result;
}

}  // namespace kvscope
