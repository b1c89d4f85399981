#include "commands/commands.h"

#include "kv/capture_loader.h"
#include "results/results_file.h"
#include "util/content_hash.h"

#include <algorithm>
#include <filesystem>

#include <iomanip>
#include <memory>
#include <set>
#include <sstream>

namespace kvscope::cli {

namespace {

std::string heldRanges(const LayerSource& kv)
{
    // "0-38, 40-58 of 60": the positions that hold data.
    std::string text;
    for (std::int64_t p = 0; p < kv.seq;) {
        if (!kv.present[std::size_t(p)]) {
            ++p;
            continue;
        }
        std::int64_t q = p;
        while (q + 1 < kv.seq && kv.present[std::size_t(q + 1)])
            ++q;
        text += (text.empty() ? "" : ",") + std::to_string(p) + (q > p ? "-" + std::to_string(q) : "");
        p = q + 1;
    }
    return (text.empty() ? "none" : text);
}

// A state-space layer's state as the bundle holds it, without its values: "mamba2, TP 2,
// checkpoints 8-21 (3): conv [3, 96, 3] bfloat16, ssm [3, 4, 16, 16] float32 per rank".
std::string describeState(const LayerStateRecord& s)
{
    std::ostringstream text;
    text << (s.kind.empty() ? "state" : s.kind) << ", TP " << s.ranks.size() << ", checkpoints " << s.positions.front()
         << "-" << s.positions.back() << " (" << s.positions.size() << "):";
    for (std::size_t i = 0; i < s.ranks.at(0).size(); ++i) {
        const StatePart& part = s.ranks[0][i];
        text << (i ? ", " : " ") << part.name << " " << shapeToString(part.tensor.shape) << " " << dtypeName(part.tensor.dtype);
    }
    text << " per rank";
    return text.str();
}

// `stateLayers`: the state-space layers whose recurrent state some prompt holds (compared).
void printConfig(const KvCacheConfig& c, std::ostream& out, const std::set<std::string>& stateLayers = {})
{
    out << "  config: " << c.numBlocks << " blocks, TP " << c.tpSize;
    if (c.isMla())
        out << " (the MLA latent on every rank), head_size " << c.firstCompared().headSize << "\n";
    else
        out << " (" << describeHeads(c.layout(c.firstCompared())) << "), head_size " << c.firstCompared().headSize << "\n";
    if (c.dcpSize > 1)
        out << "  " << describeContextParallel(c) << "\n";
    for (std::size_t g = 0; g < c.groups.size(); ++g) {
        const KvCacheGroup& group = c.groups[g];
        const bool statesHeld = std::any_of(group.layerNames.begin(), group.layerNames.end(),
                                            [&](const std::string& layer) { return stateLayers.count(layer) > 0; });
        if (statesHeld) {
            out << "    group " << g << ": " << group.specName << ", " << group.layerNames.size()
                << " layers, their recurrent state compared\n";
            continue;
        }
        out << "    group " << g << ": " << describeGroup(c.groups[g]);
        if (group.specType != SpecType::NotCompared && group.totalKvHeads != c.firstCompared().totalKvHeads)
            out << " (" << describeHeads(c.layout(group)) << ")";  // groups that differ in head count
        out << "\n";
    }
}

// What a results file holds, and whether its bundle is at hand (exit 0 when the file reads).
int inspectResults(const std::string& path, std::ostream& out)
{
    const ResultsFile r = readResultsFile(path);
    const BundleMetadata& meta = r.bundle->metadata();
    std::error_code error;
    const std::uintmax_t bytes = std::filesystem::file_size(path, error);
    const std::string size = error ? "size unknown"
                             : bytes < 1000000 ? std::to_string((bytes + 999) / 1000) + " kB"
                                               : std::to_string(bytes / 1000000) + " MB";
    const std::string found = r.bundle->path() == r.bundlePath ? "at hand" : "at hand as " + r.bundle->path();
    out << "results file " << path << " (" << size << ", written by " << r.writer << ")\n"
        << "  bundle: " << r.bundlePath << " (fingerprint " << hexFingerprint(r.bundleFingerprint) << "): "
        << (r.bundleMissing.empty() ? found : "not at hand, " + r.bundleMissing) << "\n  model: " << meta.model
        << "\n  engine: " << meta.engine << "\n  created: " << meta.created << "\n";
    printConfig(r.bundle->config(), out);
    const SuspectThresholds& t = r.options.suspects;
    out << "  analysed with: suspect off-floor " << t.offFloor << ", two-way drift " << t.twoWayDrift
        << (r.options.bc ? ", BCs" : ", no BCs") << (r.options.searchSuspects ? ", suspects" : ", no suspects")
        << (r.options.unreadableBlocks == UnreadableBlockPolicy::Error ? ", strict" : "") << "\n";
    std::size_t cells = 0;
    for (const PromptAnalysis& p : r.result.prompts) {
        out << "\n  prompt " << p.id << " (" << (p.threeWay ? "three-way" : "two-way") << "): " << p.tokens
            << " positions, " << p.layers.size() << " layers x up to " << p.heads << " heads, " << p.suspects.size()
            << " suspect(s), " << p.problems.size() << " problem(s)";
        cells += p.layers.size() * std::size_t(p.tokens) * std::size_t(p.heads);
    }
    out << "\n\n  " << r.result.suspects.size() << " suspect(s) pooled, " << r.result.problems.size()
        << " prompt(s) not analysed; " << cells << " cells\n";
    return 0;
}

}  // namespace

int inspect(const Args& args, std::ostream& out, std::ostream& err)
{
    std::string path;
    OptionParser parser("inspect");
    parser.operand("BUNDLE", path);
    if (!parser.parse(args, err))
        return 2;
    std::shared_ptr<BundleReader> reader;
    try {
        if (isResultsFile(path))
            return inspectResults(path, out);
        reader = std::make_shared<BundleReader>(path);
    } catch (const std::exception& e) {
        err << "kvscope: " << e.what() << "\n";
        return 2;
    }
    const BundleMetadata& meta = reader->metadata();
    out << "bundle " << path << "\n  model: " << meta.model << "\n  engine: " << meta.engine
        << "\n  created: " << meta.created << "\n";
    if (!meta.notes.empty())
        out << "  notes: " << meta.notes << "\n";
    if (meta.engineOnly)
        out << "  engine-only: no reference KV; compared against another capture's (kvscope diff A.h5 THIS.h5) or "
               "the other end of a KV transfer (kvscope transfer PRODUCER CONSUMER)\n";
    std::set<std::string> stateLayers;
    for (const PromptInfo& p : reader->prompts())
        stateLayers.insert(p.stateLayers.begin(), p.stateLayers.end());
    printConfig(reader->config(), out, stateLayers);

    // An engine-only capture holds no reference by design: not a problem here (diff and
    // transfer read it); a prompt of any other capture without its reference is one.
    const auto engineOnlyPrompt = [&](const PromptInfo& p) {
        return meta.engineOnly && p.referenceMissing && p.problems.size() == 1;
    };
    std::vector<std::string> expectedGaps;
    for (const PromptInfo& p : reader->prompts())
        if (engineOnlyPrompt(p))
            expectedGaps.push_back(p.problems.front());
    int failures = 0;
    for (const std::string& problem : reader->validate()) {
        if (std::find(expectedGaps.begin(), expectedGaps.end(), problem) != expectedGaps.end())
            continue;
        err << "kvscope: " << problem << "\n";
        ++failures;
    }
    // Which positions each layer holds comes from the block tables, the stored block ids and
    // the references' shapes: nothing of the KV is read (analyze and check read every block,
    // checksums verified).
    CaptureLoader loader(reader, UnreadableBlockPolicy::MarkAbsent);
    loader.setValueRead(ValueRead::LayoutOnly);
    for (const PromptInfo& p : reader->prompts()) {
        const bool engineOnly = engineOnlyPrompt(p);
        out << "\n  prompt " << p.id << ": prompt_len " << p.promptLen << ", " << p.teacherTokens.size()
            << " teacher tokens, " << p.snapshots.size() << " engine snapshot(s)";
        if (!p.problems.empty() && !engineOnly) {
            out << ": cannot be analysed (see above)\n";
            continue;
        }
        out << " (seq_len";
        for (const SnapshotInfo& s : p.snapshots)
            out << " " << s.seqLen() << "/validated " << s.validatedUntil;
        out << "), divergences [";
        for (std::size_t i = 0; i < p.divergencePositions.size(); ++i)
            out << (i ? ", " : "") << p.divergencePositions[i];
        out << "], reference: " << (engineOnly ? "none (engine-only)" : p.hasBaseline ? "expected + baseline" : "expected")
            << "\n";
        if (!p.provenance.empty()) {  // where the positions' KV came from, as the capture recorded it
            const std::vector<std::string> lines = describeProvenance(p.provenance);
            out << "    provenance:";
            for (std::size_t i = 0; i < lines.size(); ++i)
                out << (i ? "; " : " ") << lines[i];
            out << "\n";
        }
        out << "    " << std::left << std::setw(32) << "layer" << std::setw(8) << "group" << std::setw(24)
            << "engine holds" << "expected holds\n";
        for (const std::string& layer : reader->config().layerNames()) {
            out << "    " << std::left << std::setw(32) << layer << std::setw(8) << reader->config().groupOf(layer);
            try {
                std::vector<std::string> problems;
                const LayerSource engine = loader.engineSource(p.id, layer, &problems);
                const std::string expected =
                    engineOnly ? "none (engine-only)"
                               : heldRanges(loader.referenceSource(p.id, ReferenceRole::Expected, layer));
                out << std::setw(24) << heldRanges(engine) << expected << "\n";
                for (const std::string& problem : problems) {
                    err << "kvscope: " << problem << "\n";
                    ++failures;
                }
            } catch (const std::exception& e) {
                out << "error\n";
                err << "kvscope: " << e.what() << "\n";
                ++failures;
            }
        }
        for (const std::string& layer : p.stateLayers) {  // a hybrid model's recurrent state (compared by analyze)
            out << "    " << std::left << std::setw(32) << layer << std::setw(8) << reader->config().groupOf(layer);
            try {
                const LayerStateRecord state = reader->readEngineStateLayout(p.id, layer);
                const auto expected = reader->readReferenceStateLayout(p.id, ReferenceRole::Expected, layer);
                out << "recurrent state: " << describeState(state) << "; expected: "
                    << (expected ? std::to_string(expected->positions.size()) + " checkpoint(s)" : std::string("none")) << "\n";
            } catch (const std::exception& e) {
                out << "error\n";
                err << "kvscope: " << e.what() << "\n";
                ++failures;
            }
        }
    }
    return failures ? 1 : 0;
}

}  // namespace kvscope::cli
