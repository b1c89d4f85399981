#include "results/results_file.h"

#include "format/bundle_error.h"
#include "format/hdf5_file.h"

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
    const std::pair<const char*, const std::array<FloatBuffer, 2>*> arrays[] = {
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
std::shared_ptr<const BundleReader> findBundle(const ResultsFile& r, const BundleOutline& outline, std::string& missing)
{
    std::vector<std::string> candidates{r.bundlePath};
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

ResultsFile readResultsFile(const std::string& path)
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
        if (version != kResultsFormatVersion)
            file.fail("/", "format_version " + std::to_string(version) + " is not supported (this kvscope reads " +
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
        r.result = readAnalysisRecord(recordFields, readJson(file, results_path::kRecord), r.options);

        for (std::size_t i = 0; i < r.result.prompts.size(); ++i) {
            PromptAnalysis& p = r.result.prompts[i];
            // Every shape checked against the record before anything is allocated for it.
            for (const StoredArray& a : storedArrays(i, p, r.options)) {
                if (!file.exists(a.dataset))  // the record says it was written: its name was damaged since
                    file.fail(a.dataset, "missing, though the analysis record lists it: the file is damaged");
                const DatasetInfo info = file.datasetInfo(a.dataset);
                if (info.shape != a.shape || info.typeClass != H5T_FLOAT || info.typeSize != 4)
                    file.fail(a.dataset, "must be float32 of shape " + shapeToString(a.shape) + ", as the record says");
            }
            std::vector<CacheScales> scales = std::move(p.cacheScales);
            p.allocate();
            p.cacheScales = std::move(scales);
            for (const StoredArray& a : storedArrays(i, p, r.options))  // (the prompt's own buffers, now sized)
                file.readRaw(a.dataset, H5T_NATIVE_FLOAT, const_cast<float*>(a.buffer->data()));
        }
    }
    r.bundle = findBundle(r, outline, r.bundleMissing);
    return r;
}

}  // namespace kvscope
