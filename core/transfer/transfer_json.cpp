#include "transfer/transfer_json.h"

#include "util/json_writer.h"

#include <ostream>

namespace kvscope {

namespace {

constexpr const char* kFormat = "kvscope-transfer";
constexpr int kVersion = 1;

void ranges(JsonWriter& w, const std::vector<PositionRange>& rs)
{
    w.array(rs.size(), [&](std::size_t i) { w.beginArray().value(rs[i].begin).value(rs[i].end).endArray(); });
}

// Sorted positions as half-open runs.
std::vector<PositionRange> runs(const std::vector<std::int64_t>& positions)
{
    std::vector<PositionRange> rs;
    for (std::int64_t p : positions) {
        if (!rs.empty() && rs.back().end == p)
            rs.back().end = p + 1;
        else
            rs.push_back({p, p + 1});
    }
    return rs;
}

void source(JsonWriter& w, const DataSource& s)
{
    w.key("source").beginObject()
        .field("prompt", s.prompt)
        .field("snapshot", s.snapshot)
        .field("last_snapshot", s.lastSnapshot)
        .field("block", s.block)
        .field("physical_block", s.physicalBlock)
        .field("kv_swapped", s.part == KvPart::V)
        .endObject();
}

void hypothesis(JsonWriter& w, const TransferExplanation& x)
{
    w.key("hypothesis");
    if (!x.explained()) {
        w.null();
        return;
    }
    w.beginObject().field("name", x.name);
    if (x.name == "layout")
        w.field("written_as", x.writtenAs).field("read_as", x.readAs);
    else if (x.name == "conversion")
        w.field("format", x.format);
    else if (x.name == "scale")
        w.key("factor").beginObject().field("k", x.factor[0]).field("v", x.factor[1]).endObject();
    else if (x.name == "block_offset")
        w.field("offset_blocks", x.offsetBlocks);
    else if (x.name == "not_written") {
        w.key("rows_written");
        if (x.rowsWritten >= 0)
            w.value(x.rowsWritten);
        else
            w.null();
        w.field("rest", x.rest);
    }
    if (x.source && x.name != "block_offset")
        source(w, *x.source);
    w.endObject();
}

void changedBlock(JsonWriter& w, const TransferResult& r, const BlockFinding& f)
{
    const ChangedBlock& b = f.block;
    const TransferExplanation& x = f.explanation;
    w.beginObject()
        .field("prompt", r.prompts[b.prompt].consumer)
        .field("producer_prompt", r.prompts[b.prompt].producer)
        .field("layer", r.layers[b.layer].name)
        .field("layer_index", b.layer)
        .field("block", b.block)
        .field("producer_block", b.producerBlock)
        .field("consumer_block", b.consumerBlock);
    w.key("positions").beginArray().value(b.comparedPositions.front()).value(b.comparedPositions.back() + 1).endArray();
    w.key("changed_positions");
    ranges(w, runs(b.changedPositions));
    w.field("whole_block", b.wholeBlock()).key("heads").numbers(b.heads);
    w.key("parts").beginArray();
    if (b.parts[0])
        w.value("k");
    if (b.parts[1])
        w.value("v");
    w.endArray();
    w.field("max_abs_difference", b.maxAbsDifference).field("explanation", x.name);
    hypothesis(w, x);
    w.field("sentence", x.sentence);
    const BlockSignature& s = x.signature;
    w.key("signature").beginObject()
        .field("changed_rows", s.changedRows)
        .field("zero_rows", s.zeroRows)
        .field("first_changed_row", s.firstChangedRow)
        .field("tail", s.tail)
        .field("searched_in_producer", s.searched)
        .field("rows_found_in_producer", s.rowsFound)
        .endObject();
    w.endObject();
}

void dtypes(JsonWriter& w, const TransferLayer& l)
{
    w.key("dtype").beginObject();
    for (std::size_t p = 0; p < 2; ++p) {
        w.key(p ? "v" : "k").beginObject()
            .field("producer", dtypeName(l.producerDType[p]))
            .field("consumer", dtypeName(l.consumerDType[p]))
            .key("judged_in");
        if (l.judgedIn[p])
            w.value(dtypeName(*l.judgedIn[p]));
        else
            w.null();
        w.endObject();
    }
    w.endObject();
}

const char* verdict(const TransferResult& r)
{
    return r.changedBlocks ? "changed" : r.comparedPositions == 0 ? "nothing_transferred" : "identical";
}

}  // namespace

void writeTransferJson(const TransferResult& r, std::ostream& out)
{
    JsonWriter w(out);
    w.beginObject()
        .field("format", kFormat)
        .field("version", kVersion)
        .field("producer", r.producerPath)
        .field("consumer", r.consumerPath)
        .field("exit_status", r.exitStatus())
        .field("verdict", verdict(r));
    w.key("layers").array(r.layers.size(), [&](std::size_t i) {
        const TransferLayer& l = r.layers[i];
        w.beginObject().field("name", l.name).field("heads", l.heads).field("block_size", l.blockSize);
        dtypes(w, l);
        w.endObject();
    });
    w.key("prompts").array(r.prompts.size(), [&](std::size_t i) {
        const PromptTransfer& p = r.prompts[i];
        w.beginObject().field("producer", p.producer).field("consumer", p.consumer).field("classified_by", p.classifiedBy);
        w.key("transferred");
        ranges(w, p.positions.transferred);
        w.key("missing");
        ranges(w, p.positions.missing);
        w.key("extra");
        ranges(w, p.positions.extra);
        w.key("local");
        ranges(w, p.positions.local);
        w.key("partial").array(p.positions.partial.size(), [&](std::size_t j) {
            const PartialBlock& b = p.positions.partial[j];
            w.beginObject()
                .field("block", b.block)
                .field("producer_block", b.producerBlock)
                .field("consumer_block", b.consumerBlock);
            w.key("positions").beginArray().value(b.positions.begin).value(b.positions.end).endArray();
            w.key("arrived");
            ranges(w, b.arrived);
            w.endObject();
        });
        w.field("changed_blocks", p.changedBlocks).endObject();
    });
    w.key("only_producer").strings(r.onlyProducer);
    w.key("only_consumer").strings(r.onlyConsumer);
    w.field("compared_positions", r.comparedPositions);
    w.field("changed_block_count", r.changedBlocks);
    w.key("explanations").beginObject();
    for (const auto& [name, count] : r.byExplanation)
        w.field(name, count);
    w.endObject();
    w.key("changed_blocks").array(r.changed.size(), [&](std::size_t i) { changedBlock(w, r, r.changed[i]); });
    w.key("first_change");
    if (const auto& f = r.firstChange) {
        w.beginObject()
            .field("prompt", r.prompts[f->prompt].consumer)
            .field("producer_prompt", r.prompts[f->prompt].producer)
            .field("layer", r.layers[f->layer].name)
            .field("layer_index", f->layer)
            .field("head", f->at.head)
            .field("position", f->at.position)
            .field("part", kvPartName(f->at.part))
            .field("block", f->block)
            .field("producer_block", f->producerBlock)
            .field("consumer_block", f->consumerBlock)
            .endObject();
    } else {
        w.null();
    }
    w.key("problems").strings(r.problems);
    w.endObject();
    out << "\n";
}

void writeTransferErrorJson(const std::string& producerPath, const std::string& consumerPath, const std::string& error,
                            std::ostream& out)
{
    JsonWriter w(out);
    w.beginObject()
        .field("format", kFormat)
        .field("version", kVersion)
        .field("producer", producerPath)
        .field("consumer", consumerPath)
        .field("exit_status", 2)
        .field("verdict", "incomparable")
        .field("error", error)
        .endObject();
    out << "\n";
}

}  // namespace kvscope
