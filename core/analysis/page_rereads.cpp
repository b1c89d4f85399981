#include "analysis/page_rereads.h"

#include "analysis/map_spec.h"
#include "kv/block_layout.h"
#include "kv/capture_loader.h"
#include "util/median.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <map>
#include <set>
#include <sstream>
#include <tuple>

namespace kvscope {

namespace {

constexpr std::size_t kMaxCells = 256;  // off cells sampled, evenly
const double kInf = std::numeric_limits<double>::infinity();

// Where the merged cache took a cell from: the snapshot that wrote it, the TP rank read, the
// physical block, the head's index on the rank and the row in the block.
struct Place {
    std::size_t snapshot = 0;
    int rank = 0;
    KvPart part = KvPart::K;
    std::int64_t block = -1;
    int local = 0;
    int row = 0;
};

// The engine's stored pages of one layer of one prompt, read at the places asked for: each
// (snapshot, rank, part) read once, for the blocks asked.
class StoredPages {
public:
    StoredPages(const CaptureLoader& loader, const HypothesisInput& in)
        : m_loader(loader), m_in(in), m_layer(in.prompt.layers[std::size_t(in.layer)]),
          m_info(loader.prompt(in.prompt.id))
    {
        const int g = in.layer < int(in.prompt.layerGroups.size()) ? in.prompt.layerGroups[std::size_t(in.layer)] : -1;
        m_group = g;
        if (g >= 0 && std::size_t(g) < in.config.groups.size())
            m_span = in.config.positionsPerEntry(in.config.groups[std::size_t(g)]);
    }

    bool usable() const { return m_group >= 0 && m_span > 0 && m_in.config.dcpSize == 1 && !m_info.snapshots.empty(); }

    // Where the analysis took `c` from; none where its table entry is null.
    std::optional<Place> placeOf(const OffCell& c)
    {
        std::size_t s = 0;  // the snapshot that wrote it (snapshot_merge.h)
        while (s + 1 < m_info.snapshots.size() && c.token >= m_info.snapshots[s].validatedUntil)
            ++s;
        auto t = m_tables.find(s);
        if (t == m_tables.end())
            t = m_tables.emplace(s, m_loader.blockTable(m_info.id, s, std::size_t(m_group))).first;
        const std::int64_t row = m_info.snapshots[s].batchRow, entry = c.token / m_span;
        if (row >= t->second.rows || entry >= t->second.cols)
            return std::nullopt;
        const std::int64_t block = t->second.at(row, entry);
        if (block < 0 || block >= m_in.config.numBlocks)
            return std::nullopt;
        const TpLayout layout = m_in.config.layoutOf(m_layer);
        const int per = layout.mode() == TpMode::Partitioned ? layout.headsPerRank() : 1;
        const std::vector<int> ranks = layout.contributingRanks();
        if (std::size_t(c.head / per) >= ranks.size())
            return std::nullopt;
        return Place{s, ranks[std::size_t(c.head / per)], c.part, block, c.head % per, int(c.token % m_span)};
    }

    // The rows at `places` (null: none), decoded; false where a place is not stored.
    std::vector<std::vector<float>> read(const std::vector<std::optional<Place>>& places)
    {
        std::map<std::tuple<std::size_t, int, int>, std::set<std::int64_t>> wanted;
        for (const std::optional<Place>& p : places)
            if (p)
                wanted[{p->snapshot, p->rank, int(p->part)}].insert(p->block);
        std::map<std::tuple<std::size_t, int, int>, PagedShard> shards;
        for (const auto& [key, blocks] : wanted) {
            try {
                shards[key] = m_loader.engineShard(m_info.id, std::get<0>(key), std::get<1>(key), m_layer,
                                                   KvPart(std::get<2>(key)), {blocks.begin(), blocks.end()});
            } catch (const std::exception&) {
                // not stored, or unreadable: those places predict nothing
            }
        }
        std::vector<std::vector<float>> rows(places.size());
        for (std::size_t i = 0; i < places.size(); ++i) {
            const std::optional<Place>& p = places[i];
            if (!p)
                continue;
            const auto it = shards.find({p->snapshot, p->rank, int(p->part)});
            if (it == shards.end() || it->second.blocks.shape.size() != 4)
                continue;
            const PagedShard& shard = it->second;
            const auto at = std::find(shard.physicalIds.begin(), shard.physicalIds.end(), p->block);
            const std::int64_t heads = shard.blocks.shape[1], bs = shard.blocks.shape[2], width = shard.blocks.shape[3];
            if (at == shard.physicalIds.end() || p->local >= heads || p->row >= bs)
                continue;
            const std::int64_t slot = at - shard.physicalIds.begin();
            rows[i].resize(std::size_t(width));
            shard.blocks.decode(((slot * heads + p->local) * bs + p->row) * width, width, rows[i].data());
        }
        return rows;
    }

private:
    const CaptureLoader& m_loader;
    const HypothesisInput& m_in;
    const std::string m_layer;
    const PromptInfo& m_info;
    int m_group = -1;
    std::int64_t m_span = 0;
    std::map<std::size_t, BlockTable> m_tables;
};

std::vector<OffCell> sampled(const std::vector<OffCell>& cells)
{
    std::vector<OffCell> out;
    const std::size_t stride = std::max<std::size_t>(1, (cells.size() + kMaxCells - 1) / kMaxCells);
    for (std::size_t i = 0; i < cells.size(); i += stride)
        out.push_back(cells[i]);
    return out;
}

HeadDims dimsOf(const HypothesisInput& in)
{
    return std::size_t(in.layer) < in.prompt.layerDims.size() ? in.prompt.layerDims[std::size_t(in.layer)] : in.prompt.dims;
}

// The residuals of rows re-read for `cells` against the reference: each row should be the
// reference's vector of its cell. Median, and the share of cells within `in.explained`; how
// many rows there were to compare.
struct Residual {
    double median = kInf, share = 0;
    std::size_t compared = 0;
};
Residual residualOf(const HypothesisInput& in, const std::vector<OffCell>& cells, const std::vector<std::vector<float>>& rows)
{
    const HeadDims dims = dimsOf(in);
    std::vector<double> r;
    Residual out;
    std::size_t within = 0;
    for (std::size_t i = 0; i < cells.size(); ++i) {
        const OffCell& c = cells[i];
        const float* ref = in.reference.at(c.part, c.token, c.head);
        if (!ref || int(rows[i].size()) != dims.of(c.part)) {
            r.push_back(kInf);
            continue;
        }
        ++out.compared;
        r.push_back(in.ratios.between(in.layer, c.token, c.part, ref, ref, rows[i].data(), dims.of(c.part)));
        within += r.back() <= in.explained;
    }
    out.median = median(r);
    out.share = cells.empty() ? 0.0 : double(within) / double(cells.size());
    return out;
}

double errorBefore(const std::vector<OffCell>& cells)
{
    std::vector<double> r;
    for (const OffCell& c : cells)
        r.push_back(c.ratio);
    return median(r);
}

}  // namespace

std::optional<Hypothesis> cacheOrderHypothesis(const CaptureLoader& loader, const HypothesisInput& in)
{
    const HeadDims dims = dimsOf(in);
    if (dims.k != dims.v || in.cells.empty())
        return std::nullopt;  // an MLA latent's parts are not pages of one shape
    StoredPages pages(loader, in);
    if (!pages.usable())
        return std::nullopt;
    const std::vector<OffCell> cells = sampled(in.cells);
    std::vector<std::optional<Place>> own;
    for (const OffCell& c : cells)
        own.push_back(pages.placeOf(c));
    const std::vector<CacheMisread> misreads = cacheMisreads(in.config.numBlocks);
    std::optional<Hypothesis> best;
    for (std::size_t m = 0; m < misreads.size(); ++m) {
        // Stored as misread m read them; the page as written lies where the other order puts it.
        const CacheMisread& undo = misreads[1 - m];
        std::vector<std::optional<Place>> places = own;
        for (std::optional<Place>& p : places)
            if (p) {
                const CachePage from = undo.source({p->part, p->block});
                p->part = from.part;
                p->block = from.block;
            }
        const Residual r = residualOf(in, cells, pages.read(places));
        if (r.compared * 2 < cells.size() || r.median > in.explained || (best && r.median >= best->residualFloors))
            continue;
        Hypothesis h{"layout", {{"num_blocks", double(in.config.numBlocks)}}, "", r.median, errorBefore(cells), r.share};
        h.labels = {{"written_as", misreads[m].writtenAs}, {"read_as", misreads[m].readAs}};
        const auto shape = [](const std::string& order) {
            return order == "kv_first" ? "K/V-first ([2, num_blocks, ...]: every K page, then every V page)"
                                       : "blocks-first ([num_blocks, 2, ...]: each block's K page, then its V page)";
        };
        h.text = "the layer's cache was written " + std::string(shape(misreads[m].writtenAs)) + " and read " +
                 shape(misreads[m].readAs) + ", " + std::to_string(in.config.numBlocks) +
                 " blocks: each page read holds another block's; the stored pages re-read in the written order give the reference";
        best = h;
    }
    return best;
}

std::optional<Hypothesis> readRankHeadHypothesis(const CaptureLoader& loader, const HypothesisInput& in,
                                                 const std::vector<ReplicaDifference>& differences)
{
    const std::string& layer = in.prompt.layers[std::size_t(in.layer)];
    const auto d = std::find_if(differences.begin(), differences.end(), [&](const ReplicaDifference& x) {
        return x.layer == layer && x.readHoldsHead >= 0 && x.head >= 0;
    });
    if (d == differences.end() || in.cells.empty())
        return std::nullopt;
    StoredPages pages(loader, in);
    if (!pages.usable())
        return std::nullopt;
    const std::vector<OffCell> cells = sampled(in.cells);
    std::vector<std::optional<Place>> places;
    for (const OffCell& c : cells) {
        std::optional<Place> p = c.head == d->head ? pages.placeOf(c) : std::nullopt;
        if (p && p->rank == d->againstRank)
            p->rank = d->rank;  // its replica's copy, in its place
        else
            p.reset();
        places.push_back(p);
    }
    const Residual r = residualOf(in, cells, pages.read(places));
    if (r.compared * 2 < cells.size() || r.median > in.explained)
        return std::nullopt;
    Hypothesis h{"replica_head",
                 {{"rank", double(d->againstRank)}, {"holds_head", double(d->readHoldsHead)}, {"should_hold_head", double(d->head)},
                  {"replica_rank", double(d->rank)}, {"equals_rank", double(d->holdsFrom)}, {"read", 1.0}},
                 "", r.median, errorBefore(cells), r.share};
    h.text = d->wrongHeadText() + ": its copy is rank " + std::to_string(d->holdsFrom) + "'s (head " +
             std::to_string(d->readHoldsHead) + "'s) bit for bit, and rank " + std::to_string(d->rank) +
             "'s copy, read in its place, gives the reference's head " + std::to_string(d->head);
    return h;
}

std::vector<Suspect> replicaHeadSuspects(const PromptAnalysis& p)
{
    std::vector<Suspect> out;
    std::set<std::pair<std::string, int>> named;  // (layer, rank): one suspect each, its first snapshot's
    for (const ReplicaDifference& d : p.replicaDifferences) {
        if (d.copyHoldsHead < 0 || d.head < 0 || !named.insert({d.layer, d.rank}).second)
            continue;
        const auto at = std::find(p.layers.begin(), p.layers.end(), d.layer);
        if (at == p.layers.end())
            continue;
        const int layer = int(at - p.layers.begin());
        Suspect s;
        s.pattern = SuspectPattern::TpRank;
        s.score = 0;
        s.prompts = {p.id};
        s.firstLayer = d.layer;
        s.layers = {d.layer};
        s.kv = "kv";
        s.heads = {d.head};
        s.tpRanks = {d.rank};
        s.firstToken = d.firstPosition;
        s.lastToken = d.lastPosition;
        s.phase = s.lastToken < p.promptLen ? "prefill" : s.firstToken >= p.promptLen ? "decode" : "both";
        if (std::size_t(layer) < p.layerGroups.size() && p.layerGroups[std::size_t(layer)] >= 0)
            s.blocks = {{p.layerGroups[std::size_t(layer)], d.logicalBlock, d.physicalBlock}};
        s.worstLayer = layer;
        s.worstToken = d.firstPosition;
        s.worstHead = d.head;
        Hypothesis h{"replica_head",
                     {{"rank", double(d.rank)}, {"holds_head", double(d.copyHoldsHead)}, {"should_hold_head", double(d.head)},
                      {"replica_rank", double(d.againstRank)}, {"equals_rank", double(d.holdsFrom)}, {"read", 0.0}},
                     "", 0, 0, 1};
        h.text = d.wrongHeadText() + ": its copy is rank " + std::to_string(d.holdsFrom) + "'s (head " +
                 std::to_string(d.copyHoldsHead) + "'s) bit for bit in every block compared";
        s.hypothesis = h;
        s.tried = {h};
        std::ostringstream why;
        why << "TP rank " << d.rank << "'s copy of " << shortLayerName(d.layer) << " differs from rank " << d.againstRank
            << "'s, the copy the analysis reads, in " << d.blocks << " block(s) from position " << d.firstPosition
            << " (snapshot " << d.snapshot << "). Explained: " << h.text
            << ". The merged cache reads rank " << d.againstRank << "; the query heads rank " << d.rank << " serves attend to head "
            << d.copyHoldsHead << "'s keys and values.";
        s.evidence = why.str();
        s.evidencePrompt = p.id;
        out.push_back(std::move(s));
    }
    return out;
}

}  // namespace kvscope
