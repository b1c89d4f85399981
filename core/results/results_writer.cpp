#include "results/results_writer.h"

#include "format/bundle_error.h"
#include "format/output_path.h"
#include "results/compressed_chunk.h"
#include "results/results_file.h"
#include "results/stored_map.h"
#include "util/content_hash.h"
#include "util/json_writer.h"
#include "util/partial_files.h"
#include "util/version.h"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <algorithm>
#include <limits>
#include <sstream>

namespace kvscope {

namespace {

// A layer of a few thousand tokens per chunk: a window of the map reads a few chunks, and
// one chunk of 8 heads is 128 KiB before compression.
constexpr std::int64_t kChunkTokens = 4096;
constexpr std::int64_t kTokenChunkTokens = 4 * kChunkTokens;  // the [layer][token] arrays

void writeJsonBytes(Hdf5File& file, const char* dataset, const std::string& text)
{
    file.writeRaw(dataset, H5T_NATIVE_UINT8, {std::int64_t(text.size())}, text.data());
}

}  // namespace

ResultsWriter::ResultsWriter(std::string path, const BundleOutline& bundle, const AnalysisResult& prepared,
                             const RecordedOptions& options)
    : m_path(std::move(path))
    , m_partialPath(m_path + ".partial")
    , m_options(options)
{
    requireWritableOutput(m_path, {bundle.path});
    std::ostringstream outline;
    JsonWriter w(outline);
    writeOutlineJson(w, bundle);
    const std::lock_guard lock(hdf5Mutex());
    try {
        registerPartialFile(m_partialPath);  // first: a stop request may come as soon as it exists
        m_file = std::make_unique<Hdf5File>(Hdf5File::create(m_partialPath));
        m_file->writeStringAttribute("/", "format", kResultsFormatName);
        m_file->writeIntAttribute("/", "format_version", kResultsFormatVersion);
        m_file->writeStringAttribute("/", "writer", std::string("kvscope ") + kVersion);
        std::error_code error;  // an absolute path, to find the bundle from anywhere
        const std::filesystem::path absolute = std::filesystem::absolute(bundle.path, error);
        m_file->writeStringAttribute("/", "bundle_path", error ? bundle.path : absolute.lexically_normal().string());
        m_file->writeStringAttribute("/", "bundle_fingerprint", hexFingerprint(outlineFingerprint(bundle)));
        writeJsonBytes(*m_file, results_path::kOutline, outline.str());
        for (std::size_t i = 0; i < prepared.prompts.size(); ++i) {
            m_file->createGroup(results_path::prompt(i));
            for (const StoredArray& a : storedArrays(i, prepared.prompts[i], m_options))
                m_file->createCompressedFloats(a.dataset, a.shape,
                                               a.perHead() ? std::vector<std::int64_t>{1, kChunkTokens, a.shape[2]}
                                                           : std::vector<std::int64_t>{1, kTokenChunkTokens});
            createStoredMaps(*m_file, i, prepared.prompts[i], m_options);
        }
    } catch (...) {  // no destructor runs for a constructor that throws: leave nothing behind
        m_file.reset();
        std::remove(m_partialPath.c_str());
        unregisterPartialFile(m_partialPath);
        throw;
    }
    m_writer = std::thread([this] { writerLoop(); });
}

ResultsWriter::~ResultsWriter()
{
    stopWriter(true);  // abandoned (or finished): nothing more is wanted
    if (!m_finished) {
        const std::lock_guard lock(hdf5Mutex());
        m_file.reset();
        std::remove(m_partialPath.c_str());
        unregisterPartialFile(m_partialPath);
    }
}

void ResultsWriter::writeLayer(const AnalysisResult& result, int layer)
{
    const std::lock_guard lock(m_queueMutex);
    if (m_failure)
        std::rethrow_exception(m_failure);
    m_queue.emplace_back(&result, layer);
    m_queueChanged.notify_all();
}

void ResultsWriter::writerLoop()
{
    std::unique_lock lock(m_queueMutex);
    while (true) {
        m_queueChanged.wait(lock, [this] { return m_stop || !m_queue.empty(); });
        if (m_queue.empty())
            return;  // stopped, nothing left
        const auto [result, layer] = m_queue.front();
        m_queue.pop_front();
        m_writing = true;
        lock.unlock();
        try {
            if (!m_failure)
                writeLayerNow(*result, layer);
        } catch (...) {
            lock.lock();
            m_failure = std::current_exception();
            lock.unlock();
        }
        lock.lock();
        m_writing = false;
        m_queueChanged.notify_all();
    }
}

void ResultsWriter::stopWriter(bool dropQueued)
{
    {
        const std::lock_guard lock(m_queueMutex);
        m_stop = true;
        if (dropQueued)
            m_queue.clear();
    }
    m_queueChanged.notify_all();
    if (m_writer.joinable())
        m_writer.join();
}

void ResultsWriter::writeLayerNow(const AnalysisResult& result, int layer)
{
    for (std::size_t i = 0; i < result.prompts.size(); ++i) {
        const PromptAnalysis& p = result.prompts[i];
        if (layer < 0 || std::size_t(layer) >= p.layers.size())
            continue;
        for (const StoredArray& a : storedArrays(i, p, m_options)) {
            const std::int64_t heads = a.perHead() ? a.shape[2] : 0;
            if (a.perHead() && heads == 0)
                continue;  // nothing to store
            writeCompressedLayer(*m_file, a.dataset,
                             a.buffer->data() + std::size_t(layer) * std::size_t(p.tokens) * std::size_t(std::max<std::int64_t>(1, heads)),
                             p.tokens, heads, a.perHead() ? kChunkTokens : kTokenChunkTokens, layer);
        }
        writeStoredMapLayer(*m_file, i, p, m_options, layer);
        p.releaseLayer(layer);
    }
}

void ResultsWriter::finish(const AnalysisResult& result)
{
    {
        std::unique_lock lock(m_queueMutex);
        m_queueChanged.wait(lock, [this] { return m_queue.empty() && !m_writing; });
        if (m_failure)
            std::rethrow_exception(m_failure);
    }
    stopWriter(false);
    for (std::size_t i = 0; i < result.prompts.size(); ++i)
        writeStoredMapRanges(*m_file, i, result.prompts[i], m_options);
    std::ostringstream record;
    JsonWriter w(record);
    writeAnalysisRecord(w, result, m_options);
    const std::lock_guard lock(hdf5Mutex());
    writeJsonBytes(*m_file, results_path::kRecord, record.str());
    if (result.aggregate) {  // its BCs by layer and generation index: arrays, not JSON
        const AggregateBc& a = *result.aggregate;
        const std::vector<std::int64_t> shape{std::int64_t(a.layers.size()), a.generationCount};
        const std::pair<const char*, const std::array<std::vector<float>, 2>*> arrays[] = {{"bc", &a.bc}, {"bc_vs_noise", &a.bcVsNoise}};
        for (const auto& [name, pair] : arrays)
            for (KvPart part : {KvPart::K, KvPart::V})
                if (Hdf5File::elementCount(shape) > 0)
                    m_file->writeRawChunked(results_path::aggregateArray(name, part), H5T_IEEE_F32LE, shape,
                                            (*pair)[std::size_t(part)].data(), {1, kTokenChunkTokens});
    }
    m_file.reset();
    unregisterPartialFile(m_partialPath);  // finished: an interruption from here on keeps it
    if (std::rename(m_partialPath.c_str(), m_path.c_str()) != 0)
        throw BundleError(m_path, {}, std::string("cannot move the finished results file into place: ") +
                                          std::strerror(errno));
    m_finished = true;
}

AnalysisResult analyzeAndSave(std::shared_ptr<const BundleReader> reader, AnalysisOptions options,
                              const std::string& path)
{
    const CaptureLoader loader(reader, options.unreadableBlocks);
    AnalysisResult result = prepareAnalysis(loader, options);
    ResultsWriter writer(path, reader->outline(), result, recordedOptions(options));
    options.layerDone = [&writer, &result, done = options.layerDone](int layer, int layersDone, int total) {
        writer.writeLayer(result, layer);
        if (done)
            done(layer, layersDone, total);
    };
    runAnalysis(loader, options, result);
    writer.finish(result);
    return result;
}

void saveResults(const std::string& path, const BundleOutline& bundle, const AnalysisResult& result,
                 const RecordedOptions& options)
{
    ResultsWriter writer(path, bundle, result, options);
    const std::size_t layers = result.prompts.empty() ? 0 : result.prompts.front().layers.size();
    for (std::size_t l = 0; l < layers; ++l)
        writer.writeLayer(result, int(l));
    writer.finish(result);
}

}  // namespace kvscope
