#pragma once
// The analysis of a whole bundle: every selected prompt and layer compared, and the BC
// aggregated across prompts. It streams layer by layer: the threads compare one layer of
// every prompt together (chunks of tokens) while one of them reads the next, so two layers
// are in memory whatever the number of layers. It reports progress and can be cancelled.

#include "analysis/analysis_result.h"
#include "analysis/analysis_share.h"
#include "analysis/bc_needs.h"
#include "analysis/suspect.h"
#include "kv/capture_loader.h"
#include "kv/sweep.h"

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace kvscope {

// What one window of tokens of one layer may take when read, every prompt's sides together
// (two windows are in memory: one compared, the next read).
inline constexpr std::size_t kWindowBytes = std::size_t(256) << 20;
// What result arrays (every metric of every cell, every prompt's) may take in memory, all of
// the process's together; past it they are kept in temporary files and read a layer at a time
// (util/spillable_array.h), so that memory does not grow with layers x tokens.
inline constexpr std::size_t kResultsInMemoryBytes = std::size_t(256) << 20;
// kResultsInMemoryBytes, or $KVSCOPE_RESULTS_IN_MEMORY_MB megabytes when set (0: spill any results).
std::size_t resultsInMemoryBytes();
// Where results of `bytes` go by that budget, counting the arrays the process holds in memory
// already: empty (memory) or the folder of their temporary files.
std::string resultsSpillDirectory(std::size_t bytes, std::size_t budget, const std::string& directory = {});

struct AnalysisOptions {
    std::vector<std::string> prompts;  // empty: every prompt
    std::vector<std::string> layers;   // empty: every layer
    // Threads (0: one per core). They work on one layer at a time, together (chunks of
    // tokens), while one of them reads the next layer: two layers are in memory at most.
    int threads = 0;
    // A layer longer than this many tokens is read and compared a window of tokens at a time,
    // so that memory does not grow with the context (0: windows of about windowBytes of a
    // batch of prompts' sides). Results do not depend on it.
    std::int64_t windowTokens = 0;
    // What one window may take, every prompt's sides together (0: kWindowBytes). Prompts whose
    // sides would take more together (a sweep's hundreds) are read in batches of prompts, each
    // its own windows. Results do not depend on it.
    std::size_t windowBytes = 0;
    // Result arrays larger than this many bytes, every prompt's together, are kept in temporary
    // files in spillDirectory (0: resultsInMemoryBytes(); empty: defaultSpillDirectory()).
    // Results do not depend on it.
    std::size_t resultsInMemoryBytes = 0;
    std::string spillDirectory;
    // For analyzeBundle's loader. Lenient by default: an unreadable block makes its positions
    // absent and is reported in the prompt's problems, so that a partly broken bundle still
    // shows what it can.
    UnreadableBlockPolicy unreadableBlocks = UnreadableBlockPolicy::MarkAbsent;
    // For analyzeBundle's loader: the capture an engine-only bundle borrows its reference from
    // (kvscope diff's A; see CaptureLoader).
    std::shared_ptr<const BundleReader> referenceDonor;
    // Called from the comparing thread: after each finished layer (its cells in every prompt and
    // its aggregate are final and will not change), with the layers done so far.
    std::function<void(int layer, int layersDone, int layersTotal)> layerDone;
    // Called from the comparing thread when a layer read in windows of tokens has more of it
    // compared, before the layer is done: prompts [firstPrompt, endPrompt) have their cells of
    // tokens [0, tokensDone) of `layer` written (tokensDone may pass a prompt's length). They
    // may be read during the call only (nothing writes meanwhile; a later window that cannot be
    // read clears the layer), so that a viewer can show a long layer as it fills rather than
    // when it ends.
    std::function<void(int layer, std::size_t firstPrompt, std::size_t endPrompt, std::int64_t tokensDone)> windowDone;
    const std::atomic<bool>* cancel = nullptr;
    // When a cell, a layer and so a suspect count as off the noise floor (analysis/suspect_search.h).
    SuspectThresholds suspects;
    // Whether to look for suspects at all (kvscope diff looks for those of the change instead).
    bool searchSuspects = true;
    // Which BCs to compute, per token and pooled (those left out stay NaN); none at all (kvscope
    // diff needs only the metrics): every BC stays NaN and the result has no aggregate.
    std::optional<BcNeeds> bcs = BcNeeds{};
    // Whether to fingerprint the references (PromptAnalysis::referenceHashes, which the JSON,
    // results files and kvscope diff hold): a pass over their bytes; without, they stay 0.
    bool fingerprints = true;
    // This process's share of an analysis run by several (kvscope-mpi; analysis_share.h): only
    // its prompts are allocated, read, compared and searched for suspects, the aggregate is
    // combined with the others', and the pooled suspects are left to whoever gathers the prompts.
    AnalysisShare* share = nullptr;
};

// The windows of tokens a layer of `tokens` is read in, given what its sides take per token
// (every prompt's of a batch, as float32), AnalysisOptions::windowTokens and the bytes a window
// may take: the whole layer (one window, PositionRange::all()) when it is no longer than a window.
std::vector<PositionRange> analysisWindows(std::int64_t tokens, std::size_t bytesPerToken, std::int64_t windowTokens,
                                          std::size_t budget = kWindowBytes);

class AnalysisCancelled : public std::runtime_error {
public:
    AnalysisCancelled() : std::runtime_error("analysis cancelled") {}
};

// The result's shape (prompts, layers, tokens, heads), allocated and all NaN, with the
// divergences found; the GUI can show it before any layer is done.
AnalysisResult prepareAnalysis(const CaptureLoader& loader, const AnalysisOptions& options);

// Fills `result` (from prepareAnalysis with the same options), suspects included. Throws AnalysisCancelled,
// or BundleError for problems that stop the whole analysis.
void runAnalysis(const CaptureLoader& loader, const AnalysisOptions& options, AnalysisResult& result);

// Both steps, through a loader of the bundle with options.unreadableBlocks.
AnalysisResult analyzeBundle(std::shared_ptr<const BundleReader> reader, const AnalysisOptions& options = {});

// A sweep's (kv/sweep.h): prepareAnalysis of its loader, with its bundles listed (those left
// out with why). Throws BundleError when no bundle of it can be read.
AnalysisResult prepareAnalysis(const Sweep& sweep, const AnalysisOptions& options);
AnalysisResult analyzeSweep(const Sweep& sweep, const AnalysisOptions& options = {});

}  // namespace kvscope
