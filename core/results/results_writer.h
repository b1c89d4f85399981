#pragma once
// Writes a results file (docs/results-files.md) as an analysis streams: the bundle's outline
// first, each layer's arrays as soon as the analysis has finished the layer (writeLayer, from
// AnalysisOptions::layerDone), and the record (suspects, problems, aggregate) at finish().
// The file is written under a temporary name and appears under its own only when finish()
// succeeds: a results file that exists is complete.

#include "analysis/analysis_result.h"
#include "analysis/analyzer.h"
#include "format/bundle_outline.h"
#include "format/hdf5_file.h"
#include "results/analysis_record.h"

#include <memory>
#include <string>

namespace kvscope {

class ResultsWriter {
public:
    // `prepared` is the analysis as prepareAnalysis shapes it (every array allocated).
    ResultsWriter(std::string path, const BundleOutline& bundle, const AnalysisResult& prepared,
                  const RecordedOptions& options);
    ~ResultsWriter();  // without finish(), removes the partial file

    // Layer `layer` of every prompt; safe beside bundle reads on other threads (the HDF5 lock).
    void writeLayer(const AnalysisResult& result, int layer);
    void finish(const AnalysisResult& result);

private:
    std::string m_path;
    std::string m_partialPath;
    RecordedOptions m_options;
    std::unique_ptr<Hdf5File> m_file;
    bool m_finished = false;
};

// Analyses the bundle of `reader` (analyzeBundle), writing the results file `path` as the
// layers finish (kvscope analyze --save).
AnalysisResult analyzeAndSave(std::shared_ptr<const BundleReader> reader, AnalysisOptions options,
                              const std::string& path);

// The whole of a finished analysis at once (the app saving what it has shown).
void saveResults(const std::string& path, const BundleOutline& bundle, const AnalysisResult& result,
                 const RecordedOptions& options);

}  // namespace kvscope
