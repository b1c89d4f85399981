#include "commands/commands.h"

#include "analysis/analyzer.h"
#include "analysis/threshold_check.h"
#include "diff/capture_diff.h"
#include "diff/diff_json.h"
#include "format/bundle_error.h"
#include "format/output_path.h"
#include "kv/capture_loader.h"
#include "results/analysis_input.h"

#include <cmath>
#include <fstream>
#include <iomanip>
#include <sstream>

namespace kvscope::cli {

namespace {

std::string floors(double x)
{
    std::ostringstream s;
    s << std::setprecision(x < 10 ? 2 : 3) << x;
    return s.str();
}

std::string cellText(const DiffResult& d, const CellMove& c)
{
    if (c.token < 0)
        return d.layerNamesB[std::size_t(c.layer)] + " (a broad shift: no single cell beyond noise)";
    return d.layerNamesB[std::size_t(c.layer)] + ", token " + std::to_string(c.token) + " of prompt " + c.prompt + " (" +
           d.partNames[std::size_t(c.part)] + ": " + floors(c.a) + " -> " + floors(c.b) + " floors)";
}

void printDiff(const DiffResult& d, std::ostream& out)
{
    out << "kvscope diff: A " << d.pathA << (d.aFromAnalysisJson ? " (analysis)" : "") << " -> B " << d.pathB << "\n";
    out << "  prompts: " << d.matched.size() << " matched by their tokens";
    for (std::size_t i = 0; i < d.matched.size() && i < 8; ++i)
        out << (i ? ", " : " (") << d.matched[i].first << (d.matched[i].first == d.matched[i].second ? "" : "=" + d.matched[i].second);
    out << (d.matched.size() > 8 ? ", ...)" : ")") << "\n";
    for (const auto& [which, ids] : {std::pair{"A", &d.onlyA}, std::pair{"B", &d.onlyB}})
        if (!ids->empty()) {
            out << "  only in " << which << " (not compared):";
            for (const std::string& id : *ids)
                out << " " << id;
            out << "\n";
        }
    for (const auto& [which, names] : {std::pair{"A", &d.layersOnlyA}, std::pair{"B", &d.layersOnlyB}})
        if (!names->empty())
            out << "  layers only in " << which << ": " << names->size() << " (not compared)\n";
    if (d.referenceFromA)
        out << "  reference: A's expected" << (d.threeWay ? " and baseline" : "") << " (B is an engine-only capture)\n";
    else
        out << "  reference: the same expected" << (d.threeWay ? " and baseline" : "") << " (fingerprints)\n";
    out << "  per layer, the " << diffStatName(d.options.stat) << " of the cells' error ratio in floors ("
        << (d.threeWay ? "L-inf over the expected-vs-baseline noise floor" : "relative L2 over the cache dtype's rounding")
        << "); worse: above what noise reaches and more than " << d.options.maxWorse << "x A's\n";

    const int worse = d.count(Change::Worse), better = d.count(Change::Better);
    if (worse) {
        out << "\nREGRESSIONS: " << worse << " layer(s) worse\n";
        for (const LayerDiff& l : d.layers) {
            if (l.verdict() != Change::Worse)
                continue;
            for (KvPart part : {KvPart::K, KvPart::V}) {
                const std::size_t p = std::size_t(part);
                if (l.change[p] != Change::Worse)
                    continue;
                out << "  " << std::left << std::setw(32) << l.name << std::setw(6) << d.partNames[p] << "A "
                    << floors(l.statA[p]) << " -> B " << floors(l.statB[p]) << " floors";
                if (l.statA[p] > 0)
                    out << " (" << floors(l.statB[p] / l.statA[p]) << "x)";
                out << ", " << l.worseCells[p] << " of " << l.cells[p] << " cells worse\n";
            }
        }
        if (d.firstWorse)
            out << "  first worse: " << cellText(d, *d.firstWorse) << "\n";
    } else if (!d.worstMoves.empty()) {
        // Cells beyond noise that the chosen statistic does not move: said, though not a regression.
        out << "\nno layer's " << diffStatName(d.options.stat) << " is worse, but cells are (not a regression by --stat "
            << diffStatName(d.options.stat) << "); the worst: " << cellText(d, d.worstMoves.front()) << "\n";
    }
    if (!d.suspects.empty()) {
        out << "  suspects of the change:\n";
        for (const Suspect& s : d.suspects)
            out << "    " << suspectPatternName(s.pattern)
                << (s.pattern == SuspectPattern::NonFinite ? std::string() : " (score " + floors(s.score) + ")") << ": "
                << (s.prompts.size() > 1 ? "in " + s.evidencePrompt + ": " : std::string()) << s.evidence << "\n";
    }
    if (better) {
        out << "\nbetter: " << better << " layer(s)\n";
        for (const LayerDiff& l : d.layers)
            if (l.verdict() == Change::Better)
                out << "  " << std::left << std::setw(32) << l.name << d.partNames[0] << " A " << floors(l.statA[0]) << " -> B "
                    << floors(l.statB[0]) << ", " << d.partNames[1] << " A " << floors(l.statA[1]) << " -> B "
                    << floors(l.statB[1]) << "\n";
    }
    out << "\nper layer (" << diffStatName(d.options.stat) << ", floors)\n  " << std::left << std::setw(32) << "layer"
        << std::setw(18) << d.partNames[0] + ": A -> B" << std::setw(18) << d.partNames[1] + ": A -> B" << std::setw(8)
        << "change" << "noise reaches\n";
    for (const LayerDiff& l : d.layers)
        out << "  " << std::left << std::setw(32) << l.name << std::setw(18)
            << floors(l.statA[0]) + " -> " + floors(l.statB[0]) << std::setw(18)
            << floors(l.statA[1]) + " -> " + floors(l.statB[1]) << std::setw(8) << changeName(l.verdict())
            << floors(std::max(l.noise[0], l.noise[1])) << "\n";
    if (worse)
        out << "\nB is worse than A in " << worse << " layer(s)\n";
    else if (better)
        out << "\nB is no worse than A, and better in " << better << " layer(s)\n";
    else
        out << "\nB is no worse than A\n";
}

}  // namespace

int diff(const Args& args, std::ostream& out, std::ostream& err)
{
    std::string pathA, pathB, jsonPath, statName = "max";
    DiffOptions diffOptions;
    AnalysisOptions options;
    OptionParser parser("diff");
    parser.operand("A", pathA);
    parser.operand("B", pathB);
    parser.text({"--json"}, jsonPath);
    parser.real("--max-worse", diffOptions.maxWorse);
    parser.text({"--stat"}, statName);
    parser.integer("--threads", options.threads);
    parser.real("--suspect-floor", diffOptions.suspects.offFloor);
    if (!parser.parse(args, err))
        return 2;
    if (!parseDiffStat(statName, diffOptions.stat)) {
        err << "kvscope diff: --stat must be max, p99 or median, not " << printable(statName) << "\n";
        return 2;
    }
    if (!(diffOptions.maxWorse >= 1.0) || !std::isfinite(diffOptions.maxWorse)) {
        err << "kvscope diff: --max-worse must be a number of at least 1 (B's statistic over A's)\n";
        return 2;
    }
    if (options.threads < 0 || !(diffOptions.suspects.offFloor > 0) || !std::isfinite(diffOptions.suspects.offFloor)) {
        err << "kvscope diff: --threads must be 0 (one per core) or more, --suspect-floor a positive number of floors\n";
        return 2;
    }
    options.suspects = diffOptions.suspects;
    options.searchSuspects = false;  // the change's suspects are looked for below
    options.bcs.reset();  // diff compares the metrics only
    try {
        // A first, reduced to what the comparison needs, so that only one analysis is held at a time.
        // Strict, as check is: a part of either capture that cannot be read is not a pass.
        if (!jsonPath.empty())
            requireWritableOutput(jsonPath, {pathA, pathB});
        const DiffSide a = loadDiffSide(pathA, options);
        // B a bundle, or a results file whose bundle is at hand (the change's suspects read its KV).
        options.referenceDonor = a.bundle;  // an engine-only B is compared against A's reference
        const AnalysisInput b = analysisForVerdict(pathB, options);
        if (!b.bundleMissing.empty())
            throw BundleError(pathB, {}, "B's suspects need its KV, and " + b.bundleMissing);
        DiffResult d = diffAnalyses(a, b.result, CaptureLoader(b.reader, UnreadableBlockPolicy::Error, a.bundle), diffOptions);
        d.pathB = pathB;  // as given: a results file is named, not the bundle it came from
        if (!jsonPath.empty()) {
            std::ofstream file(jsonPath, std::ios::binary);
            if (file)
                writeDiffJson(d, file);
            if (!file || !file.flush())
                throw BundleError(jsonPath, {}, "cannot be written");
        }
        printDiff(d, out);
        return d.verdict() == Change::Worse ? 1 : 0;
    } catch (const DiffMismatch& e) {
        err << "kvscope diff: " << e.what() << "\n";
        return 2;
    } catch (const std::exception& e) {
        err << "kvscope: " << e.what() << "\n";
        return 2;
    }
}

}  // namespace kvscope::cli
