#pragma once
// A results file: one analysis of one bundle, kept (docs/results-files.md). HDF5, versioned
// and checksummed like bundles: every dataset in chunks with a Fletcher32 checksum, the
// per-cell arrays compressed in chunks of one layer and a few thousand tokens.

#include "analysis/analysis_result.h"
#include "format/bundle_reader.h"
#include "results/analysis_record.h"

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

namespace kvscope {

inline constexpr const char* kResultsFormatName = "kvscope-results";
// Reads 1 and 2 too, their records upgraded (results/record_upgrade.h); format 1 holds the
// aggregate's BCs by generation index in its record.
inline constexpr int kResultsFormatVersion = 3;

namespace results_path {
inline constexpr const char* kOutline = "/bundle_outline";  // JSON text, as uint8
inline constexpr const char* kRecord = "/analysis_record";  // JSON text, as uint8
std::string prompt(std::size_t index);                       // "/prompts/<index>"
std::string metric(std::size_t prompt, Metric metric);       // ".../metrics/k_cos"
// The [layer][token] arrays: "bc", "bc_vs_noise", "quant_linf", "quant_l2", each "k" and "v".
std::string tokenArray(std::size_t prompt, const char* name, KvPart part);
// The aggregate's BCs, float32 [layer, generation index]: "/aggregate/bc/k", ".../bc_vs_noise/v".
std::string aggregateArray(const char* name, KvPart part);
}  // namespace results_path

// An array a prompt keeps in a results file: its dataset, its shape ([layer, token, head] or
// [layer, token]) and where it lives in the analysis.
struct StoredArray {
    std::string dataset;
    std::vector<std::int64_t> shape;
    const SpillableArray* buffer;
    bool perHead() const { return shape.size() == 3; }
};
// Every array prompt `index` keeps: its metrics (base_* only three-way), its BCs (three-way,
// when computed), its quantisation floors (when a layer's cache is quantised). The writer and
// the reader both go by this list.
std::vector<StoredArray> storedArrays(std::size_t index, const PromptAnalysis& p, const RecordedOptions& options);

struct ResultsFile {
    std::string path;
    AnalysisResult result;
    RecordedOptions options;       // what the analysis ran with
    std::string writer;            // "kvscope 0.9.0"
    std::string bundlePath;        // where the bundle was when it was analysed
    std::uint64_t bundleFingerprint = 0;  // format/bundle_outline.h
    // The bundle's reader: the bundle itself when it is at hand (at its recorded path, or
    // beside the results file under its own name) and still the one analysed; otherwise
    // one made from the outline, which reads no data (holdsData() false).
    std::shared_ptr<const BundleReader> bundle;
    // Why the bundle is not at hand (empty when it is): "not found at PATH", "PATH is not the
    // bundle analysed (its fingerprint differs)".
    std::string bundleMissing;
};

// Whether `path` is a results file (by its format attribute); false for anything else,
// bundles included. A file that cannot be opened is one when it is named *.kvres, so that
// reading it says what is wrong with it as a results file.
bool isResultsFile(const std::string& path);
// Reads everything (the arrays into memory, or temporary files beyond the results budget:
// analyzer.h). Throws BundleError naming the file and the object when it is not a results
// file, is of another version, or is damaged.
ResultsFile readResultsFile(const std::string& path);
// readResultsFile in steps, for a viewer that shows the stored map (results/stored_map.h)
// while the rest is read: the header, outline and record, every array's shape checked (the
// bundle: the outline's reader, the prompts' arrays not yet allocated); the bundle looked for
// (opening a large one takes a while); then the arrays, a layer of every prompt at a time,
// `layerRead` told after each. Throws AnalysisCancelled when `cancel` is set between layers.
ResultsFile openResultsFile(const std::string& path);
// `chosen` (optional): a path the user gave, tried first (File > Locate bundle...).
void findResultsBundle(ResultsFile& r, const std::string& chosen = {});
void readResultsArrays(ResultsFile& r, const std::function<void(int layer)>& layerRead = {},
                       const std::atomic<bool>* cancel = nullptr);

}  // namespace kvscope
