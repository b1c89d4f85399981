#pragma once
// Writes a results file (docs/results-files.md) as an analysis streams: the bundle's outline
// first, each layer's arrays as soon as the analysis has finished the layer (writeLayer, from
// AnalysisOptions::layerDone), and the record (suspects, problems, aggregate) at finish().
// A thread of its own compresses the layers handed over (results/compressed_chunk.h), so that
// the analysis goes on meanwhile; it takes the HDF5 lock only to store the finished chunks.
// The file is written under a temporary name and appears under its own only when finish()
// succeeds: a results file that exists is complete.

#include "analysis/analysis_result.h"
#include "analysis/analyzer.h"
#include "format/bundle_outline.h"
#include "format/hdf5_file.h"
#include "results/analysis_record.h"

#include <condition_variable>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

namespace kvscope {

class ResultsWriter {
public:
    // `prepared` is the analysis as prepareAnalysis shapes it (every array allocated).
    ResultsWriter(std::string path, const BundleOutline& bundle, const AnalysisResult& prepared,
                  const RecordedOptions& options);
    ~ResultsWriter();  // without finish(), removes the partial file

    // Hands layer `layer` of every prompt over to be written. Its cells must stay as they are
    // (AnalysisOptions::layerDone's promise) and `result` alive until finish() or destruction.
    // Rethrows what went wrong with an earlier layer.
    void writeLayer(const AnalysisResult& result, int layer);
    // Waits for the layers handed over, then writes the record and moves the file into place.
    void finish(const AnalysisResult& result);

private:
    void writeLayerNow(const AnalysisResult& result, int layer);
    void writerLoop();
    void stopWriter(bool dropQueued);

    std::string m_path;
    std::string m_partialPath;
    RecordedOptions m_options;
    std::unique_ptr<Hdf5File> m_file;
    bool m_finished = false;

    std::mutex m_queueMutex;
    std::condition_variable m_queueChanged;
    std::deque<std::pair<const AnalysisResult*, int>> m_queue;
    bool m_writing = false;  // the writer is on a layer taken from the queue
    bool m_stop = false;
    std::exception_ptr m_failure;
    std::thread m_writer;
};

// Analyses the bundle of `reader` (analyzeBundle), writing the results file `path` as the
// layers finish (kvscope analyze --save).
AnalysisResult analyzeAndSave(std::shared_ptr<const BundleReader> reader, AnalysisOptions options,
                              const std::string& path);

// The whole of a finished analysis at once (the app saving what it has shown).
void saveResults(const std::string& path, const BundleOutline& bundle, const AnalysisResult& result,
                 const RecordedOptions& options);

}  // namespace kvscope
