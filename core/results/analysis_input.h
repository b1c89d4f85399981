#pragma once
// The analysis a command works on, whichever file it is given: a bundle is analysed, a
// results file is read (and checked to hold what was asked for, so that a saved analysis
// gives the verdict the bundle would).

#include "analysis/analyzer.h"
#include "format/bundle_reader.h"
#include "kv/sweep.h"

#include <memory>
#include <string>

namespace kvscope {

struct AnalysisInput {
    AnalysisResult result;
    std::shared_ptr<const BundleReader> reader;  // the bundle, or only its outline (holdsData() false)
    std::shared_ptr<const CaptureLoader> loader;  // a sweep's (no reader then)
    bool fromResultsFile = false;
    std::string bundleMissing;  // a results file's bundle not at hand: why (results/results_file.h)
};

// check's and the report's: strict, as analyzeForVerdict. A results file must have been
// analysed with the same suspect thresholds, with BCs and suspects; anything it could not
// analyse is thrown, as a bundle's would be.
AnalysisInput analysisForVerdict(const std::string& path, const AnalysisOptions& options);
// The same for a command's operands: one of the above, or a sweep (kv/sweep.h) whose bundles
// that cannot be read are left out (listed in the result), unless `strict`, where they are thrown.
// `probe` is made on each bundle of a sweep, and on one bundle when the analysis is shared.
AnalysisInput analysisForVerdict(const std::vector<std::string>& operands, const AnalysisOptions& options, bool strict,
                                 const BundleProbe& probe);

// A results file's analysis checked against `options` (its suspect thresholds, BCs, suspects);
// throws BundleError naming the file and what differs.
struct ResultsFile;
void requireAnalysedAs(const ResultsFile& results, const AnalysisOptions& options);

}  // namespace kvscope
