#include "commands/commands.h"
#include "commands/terminal_progress.h"

#include "analysis/analysis_json.h"
#include "analysis/analyzer.h"
#include "analysis/layer_selection.h"
#include "analysis/off_floor.h"
#include "analysis/source_summary.h"
#include "analysis/sweep_timeline.h"
#include "analysis/suspect.h"
#include "analysis/worst_cells.h"
#include "format/bundle_error.h"
#include "format/output_path.h"
#include "results/results_file.h"
#include "results/results_writer.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <iomanip>
#include <sstream>

namespace kvscope::cli {

namespace {

std::string fixed(float v, int digits = 4)
{
    if (std::isnan(v))
        return "-";
    std::ostringstream s;
    s << std::setprecision(digits) << v;
    return s.str();
}

// Whether every layer has the prompt's head count and widths (groups may differ in both).
bool uniformLayers(const PromptAnalysis& p)
{
    for (std::size_t l = 0; l < p.layers.size(); ++l)
        if (p.headsOf(int(l)) != p.heads || (l < p.layerDims.size() && !(p.layerDims[l] == p.dims)))
            return false;
    return true;
}

// Where the capture recorded each position's source: per source its off cells and worst cell,
// and per layer each source's worst ratio (a fault of one path shows as one column).
void printSources(const PromptAnalysis& p, const SuspectThresholds& thresholds, std::ostream& out)
{
    const std::vector<SourceSummary> sources = summarizeBySource(p, p.provenance, finalMapOffThresholds(p, thresholds));
    out << "  by source (cells off the noise floor as the map paints them; ratios in floors):\n";
    for (const SourceSummary& s : sources) {
        out << "    " << std::left << std::setw(28) << s.source << " positions " << std::setw(14) << spanText(s.spans)
            << " off " << s.offCells << " of " << s.cells << " cells";
        if (s.worstLayer >= 0)
            out << ", worst " << fixed(s.worstRatio) << " (" << p.layers[std::size_t(s.worstLayer)] << " token " << s.worstToken
                << " " << partName(p, s.worstPart) << ")";
        if (s.nonFinite)
            out << ", " << s.nonFinite << " NaN/inf value(s)";
        out << "\n";
    }
    constexpr std::size_t kColumns = 6;  // wider than a terminal past that: the JSON has them all
    if (sources.size() < 2 || sources.size() > kColumns)
        return;
    out << "  per layer by source: worst ratio over the source's positions\n    " << std::setw(34) << "";
    for (std::size_t i = 0; i < sources.size(); ++i)
        out << std::right << std::setw(10) << ("[" + std::to_string(i + 1) + "]");
    out << "   ";
    for (std::size_t i = 0; i < sources.size(); ++i)
        out << (i ? ", " : "") << "[" << i + 1 << "] " << sources[i].source;
    out << "\n";
    for (std::size_t l = 0; l < p.layers.size(); ++l) {
        out << "    " << std::left << std::setw(34) << p.layers[l];
        for (const SourceSummary& s : sources)
            out << std::right << std::setw(10) << fixed(s.layerWorst[l]);
        out << "\n";
    }
}

// Per state-space layer: its checkpoints and its worst cell in floors against its off threshold.
void printStates(const PromptAnalysis& p, std::ostream& out)
{
    out << "  state layers (recurrent state, in floors: relative L2 " << (p.threeWay ? "/ the expected-vs-baseline's" : "/ the dtype's rounding")
        << "; worst cell over the checkpoints)\n";
    for (const StateLayerAnalysis& a : p.states) {
        out << "    " << std::left << std::setw(34) << a.layer;
        if (!a.problem.empty()) {
            out << "not compared: " << a.problem << "\n";
            continue;
        }
        float worst = std::nanf("");
        std::size_t at = 0;
        int part = 0;
        std::int64_t cell = 0;
        for (std::size_t c = 0; c < a.positions.size(); ++c) {
            int pc = 0;
            std::int64_t uc = 0;
            const float r = a.worstRatio(c, &pc, &uc);
            if (std::isfinite(r) && !(r <= worst)) {
                worst = r;
                at = c;
                part = pc;
                cell = uc;
            }
        }
        out << (a.kind.empty() ? "state" : a.kind) << ", " << a.positions.size() << " checkpoint(s) "
            << a.positions.front() << "-" << a.positions.back() << ": worst " << fixed(worst) << " (off above "
            << fixed(float(a.offThreshold)) << ")";
        if (std::isfinite(worst))
            out << " at " << a.parts[std::size_t(part)].name << " cell " << cell << ", position " << a.positions[at];
        if (!a.uncompared.empty())
            out << "; " << a.uncompared.size() << " checkpoint(s) the reference lacks";
        out << "\n";
        for (const StateReplicaDifference& d : a.replicaDifferences)
            out << "      " << d.describe() << "\n";
    }
}

void printPrompt(const PromptAnalysis& p, const SuspectThresholds& thresholds, std::ostream& out)
{
    out << "\nprompt " << p.id << " (" << (p.threeWay ? "three-way" : "two-way") << "): prompt_len " << p.promptLen
        << ", " << p.tokens << " positions, " << p.layers.size() << " layers x "
        << (p.heads == 1 && partName(p, KvPart::K) != "k"
                ? "one MLA latent (" + partName(p, KvPart::K) + " " + std::to_string(p.dims.k) + " + " +
                      partName(p, KvPart::V) + " " + std::to_string(p.dims.v) + ")"
                : (uniformLayers(p) ? "" : "up to ") + std::to_string(p.heads) + " heads")
        << "\n";
    out << "  divergences:";
    if (p.divergences.empty())
        out << " none";
    for (const Divergence& d : p.divergences) {
        out << " " << d.position << (d.derived ? " (from logits" : " (recorded");
        if (d.inBounds)
            out << ", gap " << fixed(float(*d.logitGap)) << (*d.inBounds ? " within" : " beyond") << " bf16 ulp bound "
                << fixed(float(*d.ulpBound));
        out << ")";
    }
    out << "\n";
    for (const ReplicaDifference& d : p.replicaDifferences)
        out << "  replicas differ: " << d.describe() << "\n";

    out << "  suspects:";
    if (p.suspects.empty())
        out << " none (nothing leaves the noise floor)";
    out << "\n";
    for (const Suspect& s : p.suspects) {
        out << "    " << suspectPatternName(s.pattern)
            << (s.pattern == SuspectPattern::NonFinite ? std::string() : " (score " + fixed(float(s.score), 3) + ")") << ": "
            << s.evidence << "\n";
        if (s.impact)
            out << "      output: " << s.impact->text << "\n";
    }

    const std::vector<WorstCell> worst = worstCells(p, 8);
    out << "  worst cells (in floors: " << (p.threeWay ? "L-inf / the expected-vs-baseline L-inf" : "L2 / the dtype's rounding")
        << (p.heads > 1 ? ", worst head" : "") << "):\n";
    for (const WorstCell& c : worst) {
        out << "    " << std::left << std::setw(34) << p.layers[std::size_t(c.layer)] << " token " << std::setw(6) << c.token;
        if (p.heads > 1)  // (an MLA latent is one vector: no head to name)
            out << " head " << std::setw(3) << c.head;
        if (c.nonFinite)  // no number to rank by: what it holds, and where
            out << partName(p, c.part) << " holds " << nonFiniteSideText(c);
        else
            out << partName(p, c.part) << (p.threeWay ? "_linf " : "_l2 ") << std::setw(9) << fixed(c.error) << " floor "
                << std::setw(9) << fixed(c.baseError) << " ratio " << std::setw(9) << fixed(c.ratio);
        if (!p.provenance.empty())  // grouped by where the KV came from: the source of each
            if (const ProvenanceRange* r = provenanceAt(p.provenance, c.token))
                out << " from " << sourceOf(*r);
        out << "\n";
    }

    // Per layer: the largest L-inf, and (three-way) the lowest per-token BC against the noise
    // floor where a token has values enough for one.
    const bool tokenBc = p.threeWay && tokenBcMeaningful(p);
    out << (p.heads > 1 ? "  per layer: max relative L-inf over tokens and heads (token/head)"
                        : "  per layer: max relative L-inf over tokens (token)")
        << (tokenBc ? ", min BC vs noise floor over tokens (token)\n" : "\n");
    for (int l = 0; l < int(p.layers.size()); ++l) {
        out << "    " << std::left << std::setw(34) << p.layers[std::size_t(l)];
        for (KvPart part : {KvPart::K, KvPart::V}) {
            const Extreme e = layerMax(p, metricFor(part, MetricKind::Linf), l);
            out << partName(p, part) << " " << std::setw(9) << fixed(e.value) << std::setw(12)
                << (e.head < 0 ? "" : "(" + std::to_string(e.token) + (p.heads > 1 ? "/" + std::to_string(e.head) : "") + ")");
        }
        if (tokenBc)
            for (KvPart part : {KvPart::K, KvPart::V}) {
                const Extreme e = layerMinBcVsNoise(p, part, l);
                out << partName(p, part) << "_bc_vs_noise " << std::setw(7) << fixed(e.value) << std::setw(7)
                    << (e.token < 0 ? "" : "(" + std::to_string(e.token) + ")");
            }
        out << "\n";
    }
    if (p.threeWay && !tokenBc)
        out << "    (no per-token BC: a token has " << (uniformLayers(p) ? "" : "as few as ") << smallestTokenValues(p)
            << " values" << (uniformLayers(p) ? " (" + std::to_string(p.heads) + " heads x " +
                                                    std::to_string(std::min(p.dims.k, p.dims.v)) + ")" : "")
            << ", too few for one to mean anything; the combined BC below pools every token)\n";
    if (!p.states.empty())
        printStates(p, out);
    if (!p.provenance.empty())
        printSources(p, thresholds, out);
    for (const std::string& problem : p.problems)
        out << "  problem: " << problem << "\n";
    if (!p.nonFinite.empty())
        out << "  " << p.nonFinite.size() << " cell(s) hold NaN or infinity in their input (listed in the JSON)\n";
}

// A soak run: each capture's (or request's) worst cell and off cells in order of time.
void printTimeline(const SweepTimeline& t, std::ostream& out)
{
    out << "\nover " << (t.perBundle ? "the sweep" : "the requests") << " ("
        << (t.byTime ? "by capture time" : t.perBundle ? "in bundle order: not every bundle recorded a distinct time" : "by request index")
        << "): worst cell in floors, off cells, prompts with a suspect\n";
    for (const TimelinePoint& p : t.points) {
        std::ostringstream off;
        off << std::setprecision(2) << std::fixed << 100 * p.offFraction << "%";
        out << "    " << std::left << std::setw(28) << p.name;
        if (t.byTime)
            out << " +" << std::setw(9) << (std::to_string(std::int64_t(p.x)) + " s");
        out << " worst " << std::setw(9) << fixed(p.worstRatio) << " off " << std::setw(8)
            << (std::isnan(p.offFraction) ? std::string("-") : off.str()) << " suspects " << p.suspects << "/" << p.prompts << "\n";
    }
    if (!t.trend.empty())
        out << "  trend: " << t.trend << "\n";
}

// The three-way prompts pooled into the aggregate that hold no compared cell of `layer` (a
// block or reference that could not be read): the layer's pooled BCs leave them out.
std::vector<std::string> promptsNotPooledAt(const AnalysisResult& result, const std::string& layer)
{
    std::vector<std::string> ids;
    for (const PromptAnalysis& p : result.prompts) {
        if (std::find(result.aggregate->promptIds.begin(), result.aggregate->promptIds.end(), p.id) ==
            result.aggregate->promptIds.end())
            continue;
        const auto at = std::find(p.layers.begin(), p.layers.end(), layer);
        if (at == p.layers.end())
            continue;
        const int l = int(at - p.layers.begin());
        if (layerMax(p, metricFor(KvPart::K, MetricKind::Linf), l).head < 0 &&
            layerMax(p, metricFor(KvPart::V, MetricKind::Linf), l).head < 0)
            ids.push_back(p.id);
    }
    return ids;
}

// What could not be read, on the error stream too: the summary lists it with its prompt, where
// a script reading the exit code or the JSON would not look. (A sweep's bundles left out were
// warned of as it opened.)
void warnOfProblems(const AnalysisResult& result, std::ostream& err)
{
    std::vector<std::string> problems = result.problems;
    for (const PromptAnalysis& p : result.prompts)
        problems.insert(problems.end(), p.problems.begin(), p.problems.end());
    if (problems.empty())
        return;
    err << "kvscope analyze: " << problems.size() << " problem(s), the rest analysed (--strict: an error):\n";
    for (const std::string& problem : problems)
        err << "  " << problem << "\n";
}

}  // namespace

int analyze(const Args& args, std::ostream& out, std::ostream& err)
{
    std::string jsonPath, layerSpec, savePath;
    std::vector<std::string> inputs;
    AnalysisOptions options;
    bool seedBc = false;
    OptionParser parser("analyze");
    parser.operands("BUNDLE", inputs);
    parser.text({"--json"}, jsonPath);
    parser.text({"--save"}, savePath);
    parser.repeated("--prompt", options.prompts);
    parser.text({"--layers"}, layerSpec);
    parser.integer("--threads", options.threads);
    parser.flag("--strict", [&options] { options.unreadableBlocks = UnreadableBlockPolicy::Error; });
    parser.flag("--seed-bc", [&seedBc] { seedBc = true; });
    addSuspectOptions(parser, options.suspects);
    if (!parser.parse(args, err))
        return 2;
    if (jsonPath.empty() && savePath.empty()) {  // the summary prints no fingerprint, and not every BC
        options.fingerprints = false;
        options.bcs = BcNeeds::summary(seedBc);
    }
    const std::string& bundle = inputs.front();
    const bool strict = options.unreadableBlocks == UnreadableBlockPolicy::Error;
    try {
        // (in the try: gone, its line cleared, before a handler prints the error)
        TerminalProgress progress(err, "kvscope analyze: analysed");
        if (progress.shown())
            options.layerDone = [&progress](int, int done, int total) { progress.update(done, total); };
        const bool sweep = isSweep(inputs);
        for (const std::string& output : {jsonPath, savePath})
            if (!output.empty())
                requireWritableOutput(output, sweep ? sweepBundlePaths(inputs) : inputs);
        AnalysisResult result;
        std::string heading;
        if (sweep) {
            if (!savePath.empty()) {
                err << "kvscope analyze: --save keeps the analysis of one bundle; a sweep's is kept as --json\n";
                return 2;
            }
            const Sweep opened = openSweep(inputs, options.unreadableBlocks, bundleProbe());
            if (strict)
                requireEveryBundle(opened);
            for (const SweepBundle& b : opened.bundles)
                if (!b.problem.empty())
                    err << "kvscope analyze: warning: left out of the sweep: " << b.problem << "\n";
            if (!layerSpec.empty() && opened.loader)
                options.layers = parseLayerSelection(layerSpec, opened.loader->config().layerNames());
            options.share = sharedAnalysis();
            result = analyzeSweep(opened, options);
            heading = "sweep " + opened.label + ": " + std::to_string(opened.bundles.size()) + " bundle(s), " +
                      std::to_string(result.prompts.size()) + " prompt(s) analysed";
        } else if (isResultsFile(bundle)) {  // a saved analysis: read, not analysed again
            if (!savePath.empty() || !layerSpec.empty() || !options.prompts.empty() || options.unreadableBlocks == UnreadableBlockPolicy::Error) {
                err << "kvscope analyze: " << bundle << " is a results file: --save, --layers, --prompt and --strict "
                    << "apply to analysing a bundle\n";
                return 2;
            }
            ResultsFile saved = readResultsFile(bundle);
            heading = "results file " + bundle + " (the analysis of " + saved.bundlePath + "): " +
                      std::to_string(saved.result.prompts.size()) + " prompt(s)";
            result = std::move(saved.result);
        } else {
            if (sharedAnalysis() && bundleProbe())  // kvscope-mpi: probed before MPI started (kvscope: in its guarded child)
                bundleProbe()(bundle);
            auto reader = std::make_shared<BundleReader>(bundle);
            if (!layerSpec.empty())
                options.layers = parseLayerSelection(layerSpec, reader->config().layerNames());
            options.share = sharedAnalysis();
            if (savePath.empty()) {
                result = analyzeBundle(reader, options);
            } else if (options.share) {  // the layers of every process are only whole once gathered
                result = analyzeBundle(reader, options);
                saveResults(savePath, reader->outline(), result, recordedOptions(options));
            } else {
                result = analyzeAndSave(reader, options, savePath);
            }
            progress.clear();
            if (!savePath.empty())
                out << "wrote " << savePath << "\n";
        }
        progress.clear();
        if (!jsonPath.empty()) {
            std::ofstream file(jsonPath, std::ios::binary);
            if (!file)
                throw BundleError(jsonPath, {}, "cannot be written");
            writeAnalysisJson(result, file, options.suspects);
            if (!file.flush())
                throw BundleError(jsonPath, {}, "write failed");
            out << "wrote " << jsonPath << "\n";
            warnOfProblems(result, err);
            return 0;
        }
        if (heading.empty())
            heading = "bundle " + bundle + ": " + std::to_string(result.prompts.size()) + " prompt(s) analysed";
        out << heading << "\n";
        for (const SweepBundle& b : result.bundles)
            out << "  bundle " << b.name << ": " << (b.problem.empty() ? b.path : "left out: " + b.problem) << "\n";
        for (const std::string& problem : result.problems)
            out << "cannot analyse: " << problem << "\n";
        for (const std::string& line : describeNotCompared(result.notCompared))
            out << "not compared: " << line << "\n";
        for (const PromptAnalysis& p : result.prompts)
            printPrompt(p, options.suspects, out);
        if (const std::optional<SweepTimeline> timeline = sweepTimeline(result, options.suspects))
            printTimeline(*timeline, out);
        if (result.aggregate) {
            const AggregateBc& a = *result.aggregate;
            out << "\naggregate over " << a.promptIds.size() << " three-way prompt(s), " << a.generationCount
                << " generation indices; combined BC per layer, every token pooled ("
                << (result.prompts.empty() ? "K / V" : partTitle(result.prompts.front(), KvPart::K) + " / " +
                                                           partTitle(result.prompts.front(), KvPart::V))
                << "): against the noise floor" << (seedBc ? ", and the reference tool's" : "") << ":\n";
            for (std::size_t l = 0; l < a.layers.size(); ++l) {
                const std::string vsNoise = fixed(a.combinedVsNoise[0][l]) + " / " + fixed(a.combinedVsNoise[1][l]);
                out << "    " << std::left << std::setw(34) << a.layers[l];
                if (seedBc)
                    out << std::setw(17) << vsNoise << "reference tool's " << fixed(a.combined[0][l]) << " / "
                        << fixed(a.combined[1][l]);
                else
                    out << vsNoise;
                if (const std::vector<std::string> left = promptsNotPooledAt(result, a.layers[l]); !left.empty()) {
                    out << "  (without";
                    for (const std::string& id : left)
                        out << " " << id;
                    out << ": not compared at this layer)";
                }
                out << "\n";
            }
        }
        warnOfProblems(result, err);
        return 0;
    } catch (const std::invalid_argument& e) {
        err << "kvscope: " << e.what() << "\n";
        return 2;
    } catch (const std::exception& e) {
        err << "kvscope: " << e.what() << "\n";
        return 2;
    }
}

}  // namespace kvscope::cli
