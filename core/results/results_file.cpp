#include "results/results_file.h"

#include "analysis/analyzer.h"
#include "format/bundle_error.h"
#include "format/hdf5_file.h"
#include "results/record_upgrade.h"

#include <algorithm>
#include <filesystem>

namespace kvscope {

namespace results_path {

std::string prompt(std::size_t index)
{
    return "/prompts/" + std::to_string(index);
}

std::string metric(std::size_t promptIndex, Metric m)
{
    return prompt(promptIndex) + "/metrics/" + metricName(m);
}

std::string tokenArray(std::size_t promptIndex, const char* name, KvPart part)
{
    return prompt(promptIndex) + "/" + name + "/" + kvPartName(part);
}

std::string aggregateArray(const char* name, KvPart part)
{
    return std::string("/aggregate/") + name + "/" + kvPartName(part);
}

}  // namespace results_path

std::vector<StoredArray> storedArrays(std::size_t index, const PromptAnalysis& p, const RecordedOptions& options)
{
    std::vector<StoredArray> out;
    const std::int64_t layers = std::int64_t(p.layers.size());
    for (int m = 0; m < kMetricCount; ++m)
        if (p.threeWay || !isBaseMetric(Metric(m)))
            out.push_back({results_path::metric(index, Metric(m)), {layers, p.tokens, std::int64_t(p.heads)},
                           &p.metrics[std::size_t(m)]});
    // (as PromptAnalysis::allocate decides whether there are floors to keep)
    const bool quantised = std::any_of(p.layerDtypes.begin(), p.layerDtypes.end(), isQuantised);
    const std::pair<const char*, const std::array<SpillableArray, 2>*> arrays[] = {
        {"bc", &p.bc}, {"bc_vs_noise", &p.bcVsNoise}, {"quant_linf", &p.quantLinf}, {"quant_l2", &p.quantL2}};
    for (const auto& [name, pair] : arrays)
        if (std::string(name).starts_with("bc") ? p.threeWay && options.bc : quantised)
            for (KvPart part : {KvPart::K, KvPart::V})
                out.push_back({results_path::tokenArray(index, name, part), {layers, p.tokens},
                               &(*pair)[std::size_t(part)]});
    return out;
}

namespace {

// The text of a JSON dataset, parsed; a BundleError names it when it is not JSON.
JsonFields::Json readJson(const Hdf5File& file, const char* dataset)
{
    const DatasetInfo info = file.datasetInfo(dataset);
    if (info.shape.size() != 1 || info.typeClass != H5T_INTEGER || info.typeSize != 1)
        file.fail(dataset, "must be a 1-D array of bytes (JSON text)");
    file.requirePlausibleSize(dataset, std::uint64_t(info.shape[0]));
    std::string text(std::size_t(info.shape[0]), '\0');
    if (!text.empty())
        file.readRaw(dataset, H5T_NATIVE_UINT8, text.data());
    JsonFields::Json document = JsonFields::Json::parse(text, nullptr, false);
    if (document.is_discarded() || !document.is_object())
        file.fail(dataset, "is not a JSON object");
    return document;
}

// The bundle the results came from, if it is at hand and is still that bundle.
std::shared_ptr<const BundleReader> findBundle(const ResultsFile& r, const BundleOutline& outline, const std::string& chosen,
                                               std::string& missing)
{
    std::vector<std::string> candidates{r.bundlePath};
    if (!chosen.empty())
        candidates.insert(candidates.begin(), chosen);
    const std::filesystem::path beside =
        std::filesystem::path(r.path).parent_path() / std::filesystem::path(r.bundlePath).filename();
    if (beside.string() != r.bundlePath)
        candidates.push_back(beside.string());
    std::string why;
    for (const std::string& candidate : candidates) {
        std::error_code error;
        if (!std::filesystem::is_regular_file(candidate, error))
            continue;
        try {
            if (BundleReader::kProbeFromThreads)  // a corrupt bundle must not crash the app (BundleReader)
                BundleReader::probeInChild(candidate);
            auto reader = std::make_shared<BundleReader>(candidate);
            if (outlineFingerprint(reader->outline()) == r.bundleFingerprint)
                return reader;
            why = candidate + " is not the bundle analysed (its size or outline differs)";
        } catch (const BundleError& e) {
            why = e.what();
        }
    }
    missing = why.empty() ? "the bundle is not at " + r.bundlePath : why;
    BundleOutline copy = outline;
    copy.path = r.bundlePath;
    return std::make_shared<BundleReader>(std::move(copy));
}

// The aggregate's BCs by layer and generation index (format 2 on), each checked against the record.
void readAggregateArrays(const Hdf5File& file, AggregateBc& a)
{
    const std::vector<std::int64_t> shape{std::int64_t(a.layers.size()), a.generationCount};
    const std::pair<const char*, std::array<std::vector<float>, 2>*> arrays[] = {{"bc", &a.bc}, {"bc_vs_noise", &a.bcVsNoise}};
    for (const auto& [name, pair] : arrays)
        for (KvPart part : {KvPart::K, KvPart::V}) {
            std::vector<float>& values = (*pair)[std::size_t(part)];
            values.assign(std::size_t(Hdf5File::elementCount(shape)), std::nanf(""));
            if (values.empty())
                continue;  // (nothing to store: no decode positions in common)
            const std::string dataset = results_path::aggregateArray(name, part);
            if (!file.exists(dataset))
                file.fail(dataset, "missing, though the analysis record has an aggregate: the file is damaged");
            const DatasetInfo info = file.datasetInfo(dataset);
            if (info.shape != shape || info.typeClass != H5T_FLOAT || info.typeSize != 4)
                file.fail(dataset, "must be float32 of shape " + shapeToString(shape) + ", as the record says");
            file.readRaw(dataset, H5T_NATIVE_FLOAT, values.data());
        }
}

}  // namespace

bool isResultsFile(const std::string& path)
{
    try {
        const std::lock_guard lock(hdf5Mutex());
        const Hdf5File file = Hdf5File::openReadOnly(path);
        return file.hasAttribute("/", "format") && file.readStringAttribute("/", "format") == kResultsFormatName;
    } catch (const std::exception&) {  // unreadable: its name decides whose error message it gets
        return std::filesystem::path(path).extension() == ".kvres";
    }
}

ResultsFile openResultsFile(const std::string& path)
{
    ResultsFile r;
    r.path = path;
    BundleOutline outline;
    {
        const std::lock_guard lock(hdf5Mutex());
        Hdf5File file = Hdf5File::openReadOnly(path);
        if (!file.hasAttribute("/", "format") || file.readStringAttribute("/", "format") != kResultsFormatName)
            file.fail("/", std::string("attribute 'format' is not '") + kResultsFormatName + "': not a kvscope results file");
        const std::int64_t version = file.readIntAttribute("/", "format_version");
        if (version < 1 || version > kResultsFormatVersion)
            file.fail("/", "format_version " + std::to_string(version) + " is not supported (this kvscope reads 1 to " +
                               std::to_string(kResultsFormatVersion) + (version > kResultsFormatVersion ? "; a newer kvscope wrote it)" : ")"));
        file.setChecksumsRequired(true);
        r.writer = file.readStringAttribute("/", "writer");
        r.bundlePath = file.readStringAttribute("/", "bundle_path");
        const JsonFields attributes(path);
        r.bundleFingerprint = attributes.fingerprint(file.readStringAttribute("/", "bundle_fingerprint"), "/bundle_fingerprint");

        const JsonFields outlineFields(path + ":" + results_path::kOutline);
        outline = readOutlineJson(outlineFields, readJson(file, results_path::kOutline), "");
        outline.path = r.bundlePath;
        if (outlineFingerprint(outline) != r.bundleFingerprint)
            file.fail(results_path::kOutline, "does not match bundle_fingerprint: the file was altered");
        const JsonFields recordFields(path + ":" + results_path::kRecord);
        JsonFields::Json record = readJson(file, results_path::kRecord);
        upgradeRecordToV3(record, int(version));
        r.result = readAnalysisRecord(recordFields, record, r.options);
        if (r.result.aggregate && version >= 2)
            readAggregateArrays(file, *r.result.aggregate);
        else if (const auto& a = r.result.aggregate)  // format 1: in the record, which must have had them
            for (const auto* pair : {&a->bc, &a->bcVsNoise})
                for (const std::vector<float>& values : *pair)
                    if (values.size() != a->layers.size() * std::size_t(std::max<std::int64_t>(a->generationCount, 0)))
                        file.fail(results_path::kRecord, "aggregate: bc and bc_vs_noise must hold every layer and generation index");
        // Every shape checked against the record before anything is allocated for it.
        for (std::size_t i = 0; i < r.result.prompts.size(); ++i)
            for (const StoredArray& a : storedArrays(i, r.result.prompts[i], r.options)) {
                if (!file.exists(a.dataset))  // the record says it was written: its name was damaged since
                    file.fail(a.dataset, "missing, though the analysis record lists it: the file is damaged");
                const DatasetInfo info = file.datasetInfo(a.dataset);
                if (info.shape != a.shape || info.typeClass != H5T_FLOAT || info.typeSize != 4)
                    file.fail(a.dataset, "must be float32 of shape " + shapeToString(a.shape) + ", as the record says");
            }
    }
    outline.path = r.bundlePath;
    r.bundle = std::make_shared<BundleReader>(std::move(outline));
    r.bundleMissing = "not looked for yet";
    return r;
}

void findResultsBundle(ResultsFile& r, const std::string& chosen)
{
    r.bundleMissing.clear();
    r.bundle = findBundle(r, r.bundle->outline(), chosen, r.bundleMissing);
}

void readResultsArrays(ResultsFile& r, const std::function<void(int layer)>& layerRead, const std::atomic<bool>* cancel)
{
    std::size_t resultBytes = 0;
    for (const PromptAnalysis& p : r.result.prompts)
        resultBytes += p.resultBytes();
    const std::string spillTo = resultsSpillDirectory(resultBytes, resultsInMemoryBytes());
    for (PromptAnalysis& p : r.result.prompts) {
        std::vector<CacheScales> scales = std::move(p.cacheScales);
        p.allocate(spillTo);
        p.cacheScales = std::move(scales);
    }
    const std::size_t layers = r.result.prompts.empty() ? 0 : r.result.prompts.front().layers.size();
    for (std::size_t layer = 0; layer < layers; ++layer) {
        if (cancel && *cancel)
            throw AnalysisCancelled();
        {
            const std::lock_guard lock(hdf5Mutex());
            Hdf5File file = Hdf5File::openReadOnly(r.path);
            file.setChecksumsRequired(true);
            // A layer of every prompt at a time: spilled arrays hold only the layer being read.
            for (std::size_t i = 0; i < r.result.prompts.size(); ++i) {
                const PromptAnalysis& p = r.result.prompts[i];
                if (layer >= p.layers.size())
                    continue;
                for (const StoredArray& a : storedArrays(i, p, r.options)) {
                    std::vector<std::int64_t> start(a.shape.size(), 0), count = a.shape;
                    start[0] = std::int64_t(layer);
                    count[0] = 1;
                    std::int64_t rowValues = 1;
                    for (std::size_t d = 1; d < a.shape.size(); ++d)
                        rowValues *= a.shape[d];
                    if (rowValues > 0)
                        file.readSlab(a.dataset, H5T_NATIVE_FLOAT,
                                      const_cast<float*>(a.buffer->data()) + std::int64_t(layer) * rowValues, start, count);
                }
                p.releaseLayer(int(layer));
            }
        }
        if (layerRead)
            layerRead(int(layer));
    }
}

ResultsFile readResultsFile(const std::string& path)
{
    ResultsFile r = openResultsFile(path);
    findResultsBundle(r);
    readResultsArrays(r);
    return r;
}

}  // namespace kvscope
