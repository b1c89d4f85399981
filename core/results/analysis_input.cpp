#include "results/analysis_input.h"

#include "analysis/threshold_check.h"
#include "kv/sweep.h"
#include "format/bundle_error.h"
#include "results/results_file.h"

#include <sstream>

namespace kvscope {

void requireAnalysedAs(const ResultsFile& results, const AnalysisOptions& options)
{
    const RecordedOptions& saved = results.options;
    if (!saved.bc || !saved.searchSuspects)
        throw BundleError(results.path, results_path::kRecord,
                          "holds an analysis without BCs or suspects, which this command needs: analyse the bundle");
    if (!(saved.suspects == options.suspects)) {
        const auto describe = [](const SuspectThresholds& t) {
            std::ostringstream text;
            text << "off-floor " << t.offFloor << " (+" << t.perDecade << " a decade), two-way drift " << t.twoWayDrift
                 << " (+" << t.twoWayDriftPerDecade << "), at least " << t.minCells << " cells, noise chance "
                 << t.falseLayerChance << ", explained within " << t.explained;
            return text.str();
        };
        throw BundleError(results.path, {},
                          "was analysed with suspect thresholds " + describe(saved.suspects) + "; this command asks for " +
                              describe(options.suspects) + ": analyse the bundle with them (kvscope analyze BUNDLE --save)");
    }
}

AnalysisInput analysisForVerdict(const std::string& path, const AnalysisOptions& options)
{
    AnalysisInput input;
    if (!isResultsFile(path)) {
        auto reader = std::make_shared<BundleReader>(path);
        input.result = analyzeForVerdict(reader, options);
        input.reader = std::move(reader);
        return input;
    }
    ResultsFile results = readResultsFile(path);
    requireAnalysedAs(results, options);
    requireNoProblems(results.result);
    input.result = std::move(results.result);
    input.reader = std::move(results.bundle);
    input.fromResultsFile = true;
    input.bundleMissing = std::move(results.bundleMissing);
    return input;
}

}  // namespace kvscope

namespace kvscope {

AnalysisInput analysisForVerdict(const std::vector<std::string>& operands, const AnalysisOptions& options, bool strict,
                                 const BundleProbe& probe)
{
    if (!isSweep(operands)) {
        // A process sharing an analysis (kvscope-mpi) runs without kvscope's guarded child, which
        // probes a bundle: the probe stands for it.
        if (probe && options.share)
            probe(operands.front());
        return analysisForVerdict(operands.front(), options);
    }
    const Sweep sweep = openSweep(operands, UnreadableBlockPolicy::Error, probe);
    if (strict)
        requireEveryBundle(sweep);
    AnalysisInput input;
    input.result = analyzeForVerdict(sweep, options);
    input.loader = sweep.loader;
    return input;
}

}  // namespace kvscope
