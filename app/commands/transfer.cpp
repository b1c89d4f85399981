#include "commands/commands.h"

#include "format/bundle_error.h"
#include "format/output_path.h"
#include "transfer/transfer_compare.h"
#include "transfer/transfer_json.h"

#include <fstream>
#include <iomanip>
#include <sstream>

namespace kvscope::cli {

namespace {

std::string rangesText(const std::vector<PositionRange>& ranges)
{
    std::string text;
    for (std::size_t i = 0; i < ranges.size() && i < 8; ++i)
        text += (i ? ", " : "") + std::to_string(ranges[i].begin) +
                (ranges[i].end - 1 == ranges[i].begin ? "" : "-" + std::to_string(ranges[i].end - 1));
    return text + (ranges.size() > 8 ? ", ..." : "");
}

std::string blockText(std::int64_t block, std::int64_t producer, std::int64_t consumer)
{
    return "block " + std::to_string(block) + " (producer's physical " + std::to_string(producer) + ", consumer's " +
           std::to_string(consumer) + ")";
}

void printPositions(const TransferResult& r, std::ostream& out)
{
    for (const PromptTransfer& p : r.prompts) {
        const TransferredPositions& t = p.positions;
        out << "  prompt " << p.consumer << (p.consumer == p.producer ? "" : " (producer's " + p.producer + ")")
            << ": transferred " << (t.transferred.empty() ? "nothing" : rangesText(t.transferred));
        if (!t.missing.empty())
            out << "; missing on the consumer " << rangesText(t.missing);
        if (!t.extra.empty())
            out << "; extra on the consumer " << rangesText(t.extra);
        if (!t.local.empty())
            out << "; computed by the consumer (not compared) " << rangesText(t.local);
        out << "\n";
        for (const PartialBlock& b : t.partial)
            out << "    partial " << blockText(b.block, b.producerBlock, b.consumerBlock) << ": "
                << rangesText(b.arrived) << " of " << rangesText({b.positions}) << " arrived\n";
    }
}

void printResult(const TransferResult& r, std::ostream& out)
{
    out << "kvscope transfer: producer " << r.producerPath << " -> consumer " << r.consumerPath << "\n";
    out << "  prompts: " << r.prompts.size() << " matched by their tokens";
    for (std::size_t i = 0; i < r.prompts.size() && i < 8; ++i)
        out << (i ? ", " : " (") << r.prompts[i].producer
            << (r.prompts[i].producer == r.prompts[i].consumer ? "" : "=" + r.prompts[i].consumer);
    out << (r.prompts.size() > 8 ? ", ...)" : ")") << "\n";
    for (const auto& [which, ids] : {std::pair{"the producer", &r.onlyProducer}, std::pair{"the consumer", &r.onlyConsumer}})
        if (!ids->empty()) {
            out << "  only in " << which << " (not compared):";
            for (const std::string& id : *ids)
                out << " " << id;
            out << "\n";
        }
    out << "  layers: " << r.layers.size() << ", compared bit for bit";
    for (std::size_t p = 0; p < 2 && !r.layers.empty(); ++p)
        if (const auto& judged = r.layers.front().judgedIn[p])
            out << "; " << (p ? "V " : "K ") << dtypeName(r.layers.front().producerDType[p]) << " -> "
                << dtypeName(r.layers.front().consumerDType[p]) << ", judged within " << dtypeName(*judged)
                << "'s rounding";
    out << "\n";
    printPositions(r, out);
    for (const std::string& problem : r.problems)
        out << "  note: " << problem << "\n";

    if (r.changedBlocks) {
        out << "\nCHANGED: " << r.changedBlocks << " block(s):";
        for (const auto& [name, count] : r.byExplanation)
            out << " " << name << " " << count;
        out << "\n";
        if (const auto& f = r.firstChange)
            out << "  first change: " << r.layers[f->layer].name << " (layer " << f->layer << "), head " << f->at.head
                << ", position " << f->at.position << " (" << kvPartName(f->at.part) << "), "
                << blockText(f->block, f->producerBlock, f->consumerBlock) << ", prompt " << r.prompts[f->prompt].consumer
                << "\n";
        const std::size_t shown = std::min<std::size_t>(r.changed.size(), 20);
        for (std::size_t i = 0; i < shown; ++i) {
            const BlockFinding& f = r.changed[i];
            const ChangedBlock& b = f.block;
            out << "  " << r.layers[b.layer].name << ", prompt " << r.prompts[b.prompt].consumer << ", "
                << blockText(b.block, b.producerBlock, b.consumerBlock) << ", positions "
                << b.changedPositions.front() << "-" << b.changedPositions.back()
                << (b.wholeBlock() ? " (all compared)" : " (" + std::to_string(b.changedPositions.size()) + " of " +
                                                             std::to_string(b.comparedPositions.size()) + ")")
                << ", heads";
            for (int h : b.heads)
                out << " " << h;
            out << ": " << f.explanation.name;
            if (!f.explanation.sentence.empty())
                out << ": " << f.explanation.sentence;
            else
                out << " (" << f.explanation.signature.zeroRows << " of " << f.explanation.signature.changedRows
                    << " changed rows zero; "
                    << (f.explanation.signature.searched
                            ? std::to_string(f.explanation.signature.rowsFound) + " found anywhere in the producer"
                            : std::string("not looked up in the producer"))
                    << "; largest difference " << b.maxAbsDifference << ")";
            out << "\n";
        }
        if (r.changedBlocks > shown)
            out << "  ... " << r.changedBlocks - shown << " more (--json lists " << r.changed.size() << ")\n";
        out << "\nthe consumer's KV differs from the producer's in " << r.changedBlocks << " block(s)\n";
    } else if (r.comparedPositions == 0) {
        out << "\nnothing was transferred: no position is held by both captures\n";
    } else {
        out << "\nidentical: every transferred position's K and V (" << r.comparedPositions << " positions) "
            << "are the producer's\n";
    }
}

void writeJson(const std::string& path, const std::function<void(std::ostream&)>& write)
{
    std::ofstream file(path, std::ios::binary);
    if (file)
        write(file);
    if (!file || !file.flush())
        throw BundleError(path, {}, "cannot be written");
}

}  // namespace

int transfer(const Args& args, std::ostream& out, std::ostream& err)
{
    std::string producerPath, consumerPath, jsonPath;
    OptionParser parser("transfer");
    parser.operand("PRODUCER", producerPath);
    parser.operand("CONSUMER", consumerPath);
    parser.text({"--json"}, jsonPath);
    if (!parser.parse(args, err))
        return 2;
    try {
        if (!jsonPath.empty())
            requireWritableOutput(jsonPath, {producerPath, consumerPath});
    } catch (const std::exception& e) {
        err << "kvscope: " << e.what() << "\n";
        return 2;
    }
    // Captures that cannot be compared still get their JSON: the exit status and why.
    const auto incomparable = [&](const std::string& message) {
        err << "kvscope transfer: " << message << "\n";
        if (!jsonPath.empty()) {
            try {
                writeJson(jsonPath, [&](std::ostream& o) { writeTransferErrorJson(producerPath, consumerPath, message, o); });
            } catch (const std::exception& e) {
                err << "kvscope: " << e.what() << "\n";
            }
        }
        return 2;
    };
    try {
        const TransferResult r = compareTransfer(producerPath, consumerPath);
        if (!jsonPath.empty())
            writeJson(jsonPath, [&](std::ostream& o) { writeTransferJson(r, o); });
        printResult(r, out);
        return r.exitStatus();
    } catch (const std::exception& e) {
        return incomparable(e.what());
    }
}

}  // namespace kvscope::cli
