#include "transfer/transfer_hypotheses.h"

#include "kv/block_layout.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <sstream>
#include <tuple>

namespace kvscope {

namespace {

bool allZero(const float* row, int width)
{
    for (int d = 0; d < width; ++d)
        if (row[d] != 0.0f)
            return false;
    return true;
}

std::string number(double x)
{
    std::ostringstream s;
    s.precision(4);
    s << x;
    return s.str();
}

std::string positionsText(const ChangedBlock& b)
{
    return std::to_string(b.changedPositions.front()) + "-" + std::to_string(b.changedPositions.back());
}

// Every (position, head, part) row of `evidence` whose values differ, in order.
template <typename Fn>
void forChangedRows(const BlockEvidence& ev, Fn&& fn)
{
    const std::int64_t e = ev.block.block;
    for (std::int64_t p : ev.block.changedPositions) {
        const int r = int(p - e * ev.consumer.blockSize);
        for (int h = 0; h < ev.consumer.heads; ++h)
            for (KvPart part : {KvPart::K, KvPart::V})
                if (!rowMatches(ev.producer.row(part, e, h, r), ev.consumer, p, h, part, ev.judges[std::size_t(part)],
                                ev.producer.rowScale(part, e, h, r)))
                    fn(p, h, part, r);
    }
}

// Whether `predict` (the producer's values turned into what the consumer should hold) gives
// every changed row, judged by `judge(part)`.
bool predictsChangedRows(const BlockEvidence& ev, const std::vector<ChangedRows::Row>& changed,
                         const std::function<bool(const ChangedRows::Row&, std::vector<float>&)>& predict,
                         const std::function<ValueJudge(KvPart)>& judge)
{
    std::vector<float> expected;
    for (const ChangedRows::Row& row : changed) {
        if (!predict(row, expected))
            return false;
        const std::int64_t e = ev.block.block;
        const int r = int(row.position - e * ev.consumer.blockSize);
        if (!rowMatches(expected.data(), ev.consumer, row.position, row.head, row.part, judge(row.part),
                        ev.producer.rowScale(row.part, e, row.head, r)))
            return false;
    }
    return true;
}

}  // namespace

TransferExplanation explainLocally(const BlockEvidence& ev, ChangedRows& rows)
{
    TransferExplanation x;
    const ChangedBlock& b = ev.block;
    const std::int64_t e = b.block;
    const int bs = ev.consumer.blockSize;
    forChangedRows(ev, [&](std::int64_t p, int h, KvPart part, int r) {
        const float* got = ev.consumer.row(part, e, h, r);
        rows.rows.push_back({p, h, part, std::vector<float>(got, got + ev.consumer.dims.of(part))});
        ++x.signature.changedRows;
        if (allZero(got, ev.consumer.dims.of(part)))
            ++x.signature.zeroRows;
    });
    const auto firstChanged = std::find(b.comparedPositions.begin(), b.comparedPositions.end(), b.changedPositions.front());
    x.signature.firstChangedRow = b.changedPositions.front() - e * bs;
    x.signature.tail = std::size_t(b.comparedPositions.end() - firstChanged) == b.changedPositions.size();

    // Not written when read: zeros.
    if (x.signature.zeroRows == x.signature.changedRows) {
        x.name = "not_written";
        x.rest = "zeros";
        x.rowsWritten = x.signature.tail ? x.signature.firstChangedRow : -1;
        x.sentence = x.rowsWritten == 0 ? "the consumer's block is zeros: read before anything was written to it"
                     : x.rowsWritten > 0
                         ? "the block's first " + std::to_string(x.rowsWritten) +
                               " rows are right and the rest zeros: read while being written"
                         : "positions " + positionsText(b) + " are zeros on the consumer: not written when read";
        return x;
    }

    // A layout read as another, within each of the consumer's TP ranks' blocks.
    const bool sameWidth = ev.layer.dims.k == ev.layer.dims.v;
    const auto exactJudge = [&](KvPart part) { return ev.judges[std::size_t(part)]; };
    for (const BlockMisread& layout : blockMisreads(ev.layer.consumerHeadsPerRank, bs, sameWidth)) {
        const auto predict = [&](const ChangedRows::Row& row, std::vector<float>& out) {
            const BlockRow from = layout.source({row.part, row.head, int(row.position - e * bs)});
            const float* src = ev.producer.row(from.part, e, from.head, from.row);
            out.assign(src, src + ev.producer.dims.of(from.part));
            return true;
        };
        if (predictsChangedRows(ev, rows.rows, predict, exactJudge)) {
            x.name = "layout";
            x.writtenAs = layout.writtenAs;
            x.readAs = layout.readAs;
            x.sentence = "the producer's block written " + layout.writtenAs + " was read " + layout.readAs +
                         " (the values agree once read that way)";
            return x;
        }
    }

    // A conversion: the values cast through another format (at scale 1, or at the consumer's own).
    for (DType format : {DType::BFloat16, DType::Float16, DType::Float8E4M3, DType::Float8E5M2, DType::Float8E4M3Fnuz}) {
        if (format == ev.layer.producerDType[0] && format == ev.layer.producerDType[1])
            continue;  // the identity
        for (bool ownScale : {false, true}) {
            const auto predict = [&](const ChangedRows::Row& row, std::vector<float>& out) {
                const int r = int(row.position - e * bs);
                const float* src = ev.producer.row(row.part, e, row.head, r);
                const float scale = ownScale ? ev.consumer.rowScale(row.part, e, row.head, r) : 1.0f;
                out.resize(std::size_t(ev.producer.dims.of(row.part)));
                for (std::size_t d = 0; d < out.size(); ++d)
                    out[d] = convertThrough(format, src[d], scale);
                return true;
            };
            if (predictsChangedRows(ev, rows.rows, predict, exactJudge)) {
                x.name = "conversion";
                x.format = dtypeName(format);
                x.sentence = "the values were cast through " + x.format + (ownScale ? " at the consumer's scales" : "") +
                             " on the way";
                return x;
            }
        }
    }

    // A rescale: one factor per part (least squares over its changed rows), judged in the
    // consumer's format (or the declared conversion's).
    std::array<double, 2> dot{}, norm{};
    for (const ChangedRows::Row& row : rows.rows) {
        const float* src = ev.producer.row(row.part, e, row.head, int(row.position - e * bs));
        for (std::size_t d = 0; d < row.values.size(); ++d) {
            dot[std::size_t(row.part)] += double(row.values[d]) * double(src[d]);
            norm[std::size_t(row.part)] += double(src[d]) * double(src[d]);
        }
    }
    std::array<double, 2> factor{1.0, 1.0};
    bool rescaled = false;
    for (std::size_t p = 0; p < 2; ++p) {
        if (!b.parts[p])
            continue;
        if (!(norm[p] > 0) || !std::isfinite(dot[p] / norm[p]))
            return x;
        factor[p] = dot[p] / norm[p];
        const DType judged = ev.layer.judgedIn[p].value_or(ev.layer.consumerDType[p]);
        if (std::fabs(factor[p] - 1) <= 4 * unitRoundoff(judged))
            return x;  // not a factor: rounding apart
        // A round factor (a power of two, three digits) rather than the fit's last digits.
        const double power = std::exp2(std::round(std::log2(std::fabs(factor[p]))));
        if (std::fabs(std::fabs(factor[p]) / power - 1) < 2 * unitRoundoff(judged))
            factor[p] = std::copysign(power, factor[p]);
        rescaled = true;
    }
    if (rescaled) {
        const auto judge = [&](KvPart part) {
            return ValueJudge{ev.layer.judgedIn[std::size_t(part)].value_or(ev.layer.consumerDType[std::size_t(part)])};
        };
        const auto predict = [&](const ChangedRows::Row& row, std::vector<float>& out) {
            const float* src = ev.producer.row(row.part, e, row.head, int(row.position - e * bs));
            out.resize(row.values.size());
            for (std::size_t d = 0; d < out.size(); ++d)
                out[d] = float(double(src[d]) * factor[std::size_t(row.part)]);
            return true;
        };
        if (predictsChangedRows(ev, rows.rows, predict, judge)) {
            x.name = "scale";
            x.factor = factor;
            std::string parts;
            for (std::size_t p = 0; p < 2; ++p)
                if (b.parts[p])
                    parts += std::string(parts.empty() ? "" : ", ") + (p ? "V" : "K") + " x" + number(factor[p]);
            x.sentence = "the consumer's values are the producer's rescaled (" + parts + "): a scale lost or applied twice";
            return x;
        }
    }
    return x;
}

TransferExplanation explainBySource(const ChangedBlock& block, const ChangedRows& rows, const ProducerRows& index,
                                    std::uint32_t producerPrompt, const std::vector<std::string>& producerPromptIds,
                                    int blockSize, TransferExplanation local)
{
    TransferExplanation x = std::move(local);
    x.signature.searched = true;
    // A source block: (prompt, snapshot, entry, whether the parts are swapped), and how many of
    // the changed rows it holds at the same row of the block and the same head.
    using Key = std::tuple<std::uint32_t, std::uint32_t, std::int64_t, bool>;
    std::map<Key, std::int64_t> held;
    std::map<Key, RowOrigin> example;
    std::int64_t nonZero = 0, lookedUp = 0;
    // Rows of the tail of a block written in part: those past the written ones.
    for (const ChangedRows::Row& row : rows.rows) {
        const std::vector<RowOrigin> found = index.find(row.values.data(), int(row.values.size()));
        if (ProducerRows::fingerprint(row.values.data(), int(row.values.size())))
            ++nonZero;
        ++lookedUp;
        if (!found.empty())
            ++x.signature.rowsFound;
        std::map<Key, bool> counted;
        for (const RowOrigin& o : found) {
            if (o.head != row.head || o.position % blockSize != row.position % blockSize)
                continue;
            const Key key{o.prompt, o.snapshot, o.entry, o.part != row.part};
            if (counted[key])
                continue;
            counted[key] = true;
            ++held[key];
            example.emplace(key, o);
        }
    }
    (void)lookedUp;
    if (nonZero == 0 || x.signature.zeroRows + nonZero != x.signature.changedRows)
        return x;
    // The source holding every non-zero changed row; the prompt's own final state first, then
    // other requests', then earlier snapshots.
    const Key* best = nullptr;
    int bestRank = 4;
    for (const auto& [key, count] : held) {
        if (count != nonZero)
            continue;
        const RowOrigin& o = example.at(key);
        const int rank = o.lastSnapshot ? (o.prompt == producerPrompt ? 0 : 1) : 2;
        if (rank < bestRank) {
            bestRank = rank;
            best = &key;
        }
    }
    if (!best)
        return x;
    const RowOrigin& o = example.at(*best);
    const bool swapped = std::get<3>(*best);
    DataSource source{producerPromptIds[o.prompt], o.snapshot, o.lastSnapshot, o.entry, o.physicalBlock,
                      swapped ? KvPart::V : KvPart::K};
    const std::string where = "block " + std::to_string(o.entry) + " (physical " + std::to_string(o.physicalBlock) +
                              ") of the producer's prompt " + source.prompt +
                              (o.lastSnapshot ? std::string() : ", snapshot " + std::to_string(o.snapshot)) +
                              (swapped ? ", K and V swapped" : "");
    // Zero rows fit the source only where its block was never written either.
    for (const ChangedRows::Row& row : rows.rows)
        if (!ProducerRows::fingerprint(row.values.data(), int(row.values.size())) &&
            o.entry * blockSize + row.position % blockSize < index.written(o.prompt, o.snapshot)) {
            TransferExplanation unexplained;  // zeros and data mixed: no single story
            unexplained.signature = x.signature;
            return unexplained;
        }
    x.source = source;
    const bool partWritten = x.signature.tail && x.signature.firstChangedRow > 0 &&
                             (o.prompt != producerPrompt || !o.lastSnapshot || o.physicalBlock == block.producerBlock);
    if (o.prompt == producerPrompt && o.lastSnapshot && !partWritten) {
        x.name = "block_offset";
        x.offsetBlocks = o.entry - block.block;
        x.sentence = "consumer position p holds the producer's p " + std::string(x.offsetBlocks < 0 ? "- " : "+ ") +
                     std::to_string(std::llabs(x.offsetBlocks)) + " x block_size (" + where + ")";
    } else if (partWritten) {
        x.name = "not_written";
        x.rest = "old_data";
        x.rowsWritten = x.signature.firstChangedRow;
        x.sentence = "the block's first " + std::to_string(x.rowsWritten) +
                     " rows are right and the rest old data, of " + where + ": read while being written";
    } else if (o.lastSnapshot && o.physicalBlock != block.producerBlock) {
        x.name = "other_request";
        x.sentence = "the consumer's block holds another request's: " + where;
    } else {
        x.name = "stale_block";
        x.sentence = "the consumer's block holds what the producer's block held earlier: " + where;
    }
    return x;
}

}  // namespace kvscope
