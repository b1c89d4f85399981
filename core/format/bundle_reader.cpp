#include "format/bundle_reader.h"

#include "format/bundle_error.h"

#include <algorithm>
#include <filesystem>
#include <cerrno>
#include <csignal>
#include <cmath>
#include <cstdio>
#include <cstring>

#include <fcntl.h>
#include <poll.h>
#include <sys/wait.h>
#include <unistd.h>

namespace kvscope {

namespace {

constexpr const char* kResultsFileFormat = "kvscope-results";  // results/results_file.h's kResultsFormatName

// Whether the file says it is a results file (false when its format cannot be read as text).
bool namesResultsFormat(const Hdf5File& file)
{
    try {
        return file.readStringAttribute("/", "format") == kResultsFileFormat;
    } catch (const BundleError&) {
        return false;
    }
}

[[noreturn]] void failAsResultsFile(const Hdf5File& file)
{
    file.fail("/", "is a kvscope results file (a saved analysis), not a capture bundle; this needs the bundle "
                   "it was analysed from, which `kvscope inspect` of the results file names");
}

// Bounds on sizes that no real capture reaches; declared sizes beyond them are rejected
// before anything is allocated.
constexpr std::int64_t kMaxSeq = std::int64_t(1) << 21;  // 2M positions
constexpr std::int64_t kMaxBatch = 1 << 16;
constexpr std::int64_t kMaxVocab = std::int64_t(1) << 24;
constexpr std::int64_t kMaxTensorBytes = std::int64_t(16) << 30;

const char* const kRootMetadata[] = {"model", "engine", "created", "notes", "writer"};

std::string describe(std::chrono::milliseconds duration)
{
    char text[32];
    std::snprintf(text, sizeof text, "%g s", double(duration.count()) / 1000);
    return text;
}
}  // namespace

void BundleReader::probeInChild(const std::string& path, const std::function<void()>& inChild,
                                std::chrono::milliseconds limit)
{
#if defined(__SANITIZE_THREAD__)
    // ThreadSanitizer does not support fork() in a process with threads: no probe there.
    (void)path, (void)inChild, (void)limit;
    return;
#endif
    // Forked while holding the HDF5 lock, so that no other thread is inside libhdf5 (or holds
    // the lock) in the copy the child gets.
    std::unique_lock lock(hdf5Mutex());
    // The child's end of a pipe closes when it exits: the parent wakes then, not at its next poll.
    int exited[2] = {-1, -1};
    if (pipe2(exited, O_CLOEXEC) != 0)
        exited[0] = exited[1] = -1;
    const pid_t child = fork();
    if (child < 0) {
        for (int fd : exited)
            if (fd >= 0)
                close(fd);
        return;  // cannot fork: the real open still runs, unguarded
    }
    if (child == 0) {
        if (exited[0] >= 0)
            close(exited[0]);
        lock.unlock();
        if (inChild)
            inChild();
        try {
            // Every dataset's metadata is walked only in v1 bundles: v2's is checksummed
            // throughout (the newest HDF5 format, fixed-length strings), so corruption there is
            // an error, not a crash or a loop (no mutation or fuzzer input found either), and
            // walking it costs the app's first heatmap row 0.3 s on an 80-layer bundle.
            const BundleReader reader(path);
            if (reader.metadata().formatVersion < 2)
                reader.validate();
        } catch (...) {
        }
        _exit(0);  // nothing of the parent's (Qt, exit handlers) runs here
    }
    lock.unlock();
    if (exited[1] >= 0)
        close(exited[1]);
    // Corrupt metadata can also make libhdf5 loop for ever: a child still reading after
    // `limit` is stopped.
    const auto deadline = std::chrono::steady_clock::now() + limit;
    int status = 0;
    for (;;) {
        const pid_t done = waitpid(child, &status, WNOHANG);
        if (done == child || (done < 0 && errno != EINTR))
            break;
        const auto now = std::chrono::steady_clock::now();
        if (now >= deadline) {
            kill(child, SIGKILL);
            waitpid(child, &status, 0);
            if (exited[0] >= 0)
                close(exited[0]);
            throw BundleError(path, {}, "reading its metadata did not finish within " + describe(limit) +
                                            ": the file is corrupt (libhdf5 loops on it); it was not opened");
        }
        if (exited[0] >= 0) {
            // Until the pipe's end of file (the child gone) or a slice of the limit (a process
            // another thread forked meanwhile may hold the pipe open too: waitpid decides).
            const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - now).count() + 1;
            pollfd end{exited[0], POLLIN, 0};
            if (poll(&end, 1, int(std::min<long long>(left, 50))) > 0) {
                close(exited[0]);
                exited[0] = -1;
            }
        } else {
            usleep(500);  // the end seen (the child about to be reaped), or no pipe
        }
    }
    if (exited[0] >= 0)
        close(exited[0]);
    if (WIFSIGNALED(status))
        throw BundleError(path, {}, std::string("reading it crashed the HDF5 library (") + strsignal(WTERMSIG(status)) +
                                        "): the file's metadata is corrupt; it was not opened");
}

BundleReader::~BundleReader()
{
    const std::lock_guard lock(hdf5Mutex());
    m_file = Hdf5File();  // closes under the lock
}

BundleReader::BundleReader(const std::string& path)
    : m_path(path)
{
    const std::lock_guard lock(hdf5Mutex());
    m_file = Hdf5File::openReadOnly(path);
    std::error_code sizeError;
    m_bytes = std::filesystem::file_size(path, sizeError);
    if (!m_file.hasAttribute("/", "format") || !m_file.hasAttribute("/", "format_version"))
        m_file.fail("/", "attributes 'format' and 'format_version' are missing: not a kvscope capture bundle");
    // The version first (an integer): it says how the rest, strings included, may be read.
    const std::int64_t version = m_file.readIntAttribute("/", "format_version");
    // (but a results file has versions of its own: whatever its version, it is named for what it is)
    if (version < kOldestBundleFormatVersion || version > kBundleFormatVersion) {
        if (namesResultsFormat(m_file))
            failAsResultsFile(m_file);
        m_file.fail("/", "format_version " + std::to_string(version) + " is not supported (this kvscope reads " +
                             std::to_string(kOldestBundleFormatVersion) + " to " + std::to_string(kBundleFormatVersion) +
                             (version > kBundleFormatVersion ? "; a newer kvscope wrote it)" : ")"));
    }
    m_metadata.formatVersion = int(version);
    m_file.setChecksumsRequired(version >= 2);
    const std::string format = m_file.readStringAttribute("/", "format");
    if (format == kResultsFileFormat)
        failAsResultsFile(m_file);
    if (format != kBundleFormatName)
        m_file.fail("/", "format is '" + format + "', expected '" + kBundleFormatName + "'");
    std::string* fields[] = {&m_metadata.model, &m_metadata.engine, &m_metadata.created, &m_metadata.notes,
                             &m_metadata.writer};
    if (m_file.hasAttribute("/", "engine_only"))
        m_metadata.engineOnly = m_file.readIntAttribute("/", "engine_only") != 0;
    for (std::size_t i = 0; i < std::size(fields); ++i)
        if (m_file.hasAttribute("/", kRootMetadata[i]))
            *fields[i] = m_file.readStringAttribute("/", kRootMetadata[i]);
    for (const std::string& name : m_file.attributeNames("/")) {
        const bool known = name == "format" || name == "format_version" || name == "engine_only" ||
                           std::find(std::begin(kRootMetadata), std::end(kRootMetadata), name) != std::end(kRootMetadata);
        if (known)
            continue;
        try {  // metadata is string attributes; others (a number someone added) are not metadata
            m_metadata.extra[name] = m_file.readStringAttribute("/", name);
        } catch (const BundleError&) {
        }
    }

    m_config = KvCacheConfig::fromJson(m_file.readString(bundle_path::kConfig), path, bundle_path::kConfig);

    const std::vector<std::string> ids = m_file.children(bundle_path::kPrompts);
    if (ids.empty())
        m_file.fail(bundle_path::kPrompts, "holds no prompt");
    for (const std::string& id : ids)
        m_prompts.push_back(readPrompt(id));
}

BundleReader::BundleReader(BundleOutline outline)
    : m_path(std::move(outline.path)),
      m_metadata(std::move(outline.metadata)),
      m_config(std::move(outline.config)),
      m_prompts(std::move(outline.prompts)),
      m_bytes(outline.bytes)
{
}

BundleOutline BundleReader::outline() const
{
    return {m_path, m_bytes, m_metadata, m_config, m_prompts};
}

void BundleReader::requireData() const
{
    if (!holdsData())  // (naming an object inside a file that is not there would only be noise)
        throw BundleError(m_path, {}, "not at hand: the analysis was opened from a results file, which keeps no KV");
}

const PromptInfo& BundleReader::prompt(const std::string& id) const
{
    for (const PromptInfo& p : m_prompts)
        if (p.id == id)
            return p;
    throw BundleError(m_path, bundle_path::prompt(id), "no such prompt");
}

PromptInfo BundleReader::readPrompt(const std::string& id) const
{
    PromptInfo info;
    info.id = id;
    const std::string path = bundle_path::prompt(id);
    try {
        info.promptLen = m_file.readIntAttribute(path, "prompt_len");
        info.inputIds = m_file.readIntegers(path + "/input_ids", kMaxSeq);
        if (std::int64_t(info.inputIds.size()) != info.promptLen || info.promptLen < 1)
            m_file.fail(path + "/input_ids", std::to_string(info.inputIds.size()) + " ids but prompt_len is " +
                                                 std::to_string(info.promptLen));
        if (m_file.exists(path + "/teacher_tokens"))
            info.teacherTokens = m_file.readIntegers(path + "/teacher_tokens", kMaxSeq);
        if ((info.hasDivergences = m_file.exists(path + "/divergence_positions")))
            info.divergencePositions = m_file.readIntegers(path + "/divergence_positions", kMaxSeq);
        const std::int64_t positions = info.promptLen + std::int64_t(info.teacherTokens.size());
        if (m_file.exists(path + "/token_strings")) {
            info.tokenStrings = m_file.readStrings(path + "/token_strings");
            if (std::int64_t(info.tokenStrings.size()) != positions)
                m_file.fail(path + "/token_strings", std::to_string(info.tokenStrings.size()) + " strings for " +
                                                         std::to_string(positions) + " positions (prompt and teacher tokens)");
        }

        if (m_file.hasAttribute(path, "provenance")) {
            try {
                info.provenance = parseProvenance(m_file.readStringAttribute(path, "provenance"), positions);
            } catch (const std::invalid_argument& e) {
                m_file.fail(path, std::string("attribute 'provenance': ") + e.what());
            }
        }

        for (std::size_t s = 0; m_file.exists(bundle_path::snapshot(id, s)); ++s) {
            const std::string sp = bundle_path::snapshot(id, s);
            SnapshotInfo snap;
            snap.batchRow = m_file.readIntAttribute(sp, "batch_row");
            snap.validatedUntil = m_file.readIntAttribute(sp, "validated_until");
            snap.seqLens = m_file.readIntegers(sp + "/seq_lens", kMaxBatch);
            if (snap.batchRow < 0 || snap.batchRow >= std::int64_t(snap.seqLens.size()))
                m_file.fail(sp, "batch_row " + std::to_string(snap.batchRow) + " outside seq_lens");
            for (std::int64_t len : snap.seqLens)
                if (len != -1 && (len < 1 || len > kMaxSeq))
                    m_file.fail(sp + "/seq_lens", "sequence length " + std::to_string(len) + " is not plausible");
            if (snap.seqLen() < 1)
                m_file.fail(sp + "/seq_lens", "the prompt's own row has no length");
            if ((snap.subsetStored = m_file.exists(sp + "/physical_block_ids"))) {
                snap.storedBlockIds = m_file.readIntegers(sp + "/physical_block_ids", m_config.numBlocks);
                for (std::int64_t b : snap.storedBlockIds)
                    if (b < 0 || b >= m_config.numBlocks)
                        m_file.fail(sp + "/physical_block_ids", "id " + std::to_string(b) + " outside [0, num_blocks)");
            }
            info.snapshots.push_back(std::move(snap));
        }
        if (info.snapshots.empty())
            m_file.fail(bundle_path::snapshot(id, 0), "missing: a prompt needs at least one engine snapshot");
        const std::int64_t seqLen = info.snapshots.back().seqLen();
        for (std::int64_t d : info.divergencePositions)
            if (d < info.promptLen || d >= seqLen)
                m_file.fail(path + "/divergence_positions", "position " + std::to_string(d) + " is not a decode position [" +
                                                                std::to_string(info.promptLen) + ", " +
                                                                std::to_string(seqLen) + ")");
        info.hasExpected = m_file.exists(bundle_path::referenceRole(id, ReferenceRole::Expected));
        info.hasBaseline = m_file.exists(bundle_path::referenceRole(id, ReferenceRole::Baseline));
        if (m_file.isGroup(bundle_path::engineStates(id)))
            info.stateLayers = m_file.children(bundle_path::engineStates(id));
        info.hasImpact = m_file.exists(impactPath(id));
        for (LogitsRole role : {LogitsRole::Expected, LogitsRole::Actual, LogitsRole::Baseline})
            if (m_file.exists(bundle_path::logits(id, role)))
                info.logits.push_back(role);
        // Last, so that a prompt whose only problem this is can borrow a reference (CaptureLoader).
        if (!info.hasExpected) {
            info.referenceMissing = true;
            m_file.fail(bundle_path::referenceRole(id, ReferenceRole::Expected),
                        m_metadata.engineOnly
                            ? "missing: an engine-only capture holds no reference KV; `kvscope diff A.h5 THIS.h5` "
                              "compares it against the reference of A, a capture of the same prompts; `kvscope transfer "
                              "PRODUCER.h5 THIS.h5` (the app: Compare, transfer) with the capture its KV was sent from"
                            : "missing: the expected reference KV is required");
        }
    } catch (const BundleError& e) {
        info.problems.push_back(e.what());
    }
    return info;
}

const DatasetInfo& BundleReader::datasetInfo(const std::string& dataset) const
{
    if (const auto found = m_datasetInfos.find(dataset); found != m_datasetInfos.end())
        return found->second;
    return m_datasetInfos.emplace(dataset, m_file.datasetInfo(dataset)).first->second;
}

DType BundleReader::checkedDType(const std::string& dataset) const
{
    KnownDataset& known = m_known[dataset];
    if (known.dtype)
        return *known.dtype;
    if (!m_file.exists(dataset))
        m_file.fail(dataset, "missing");
    if (!m_file.hasAttribute(dataset, "dtype"))
        m_file.fail(dataset, "attribute 'dtype' is missing");
    const std::string name = m_file.readStringAttribute(dataset, "dtype");
    const auto dtype = parseDType(name);
    if (!dtype)
        m_file.fail(dataset, "unsupported dtype '" + name + "' (supported: bfloat16, float16, float32, float8_e4m3fn, float8_e5m2, float8_e4m3fnuz, int8, "
                                 "float4_e2m1fn, int4_per_token_head)");
    const DatasetInfo& info = datasetInfo(dataset);
    const bool isFloat = *dtype == DType::Float32 || *dtype == DType::Float16;
    if (*dtype == DType::Int8 && info.typeClass == H5T_INTEGER && !info.isSigned)  // an unsigned read would clamp negatives
        m_file.fail(dataset, "stores int8 codes as unsigned integers; they must be signed (int8)");
    else if (!isFloat && *dtype != DType::Int8 && info.isSigned)  // a signed read would clamp every negative value's bits to 0
        m_file.fail(dataset, "stores the " + name + " bits as signed integers; they must be unsigned (uint16 / uint8)");
    if ((isFloat ? info.typeClass != H5T_FLOAT : info.typeClass != H5T_INTEGER) || info.typeSize != dtypeSize(*dtype))
        m_file.fail(dataset, "stored as a " + std::to_string(info.typeSize) + "-byte " +
                                 (info.typeClass == H5T_FLOAT ? "float" : "non-float") + " type, which cannot hold " + name);
    known.dtype = *dtype;
    return *dtype;
}

RawTensor BundleReader::storedAs(const std::string& dataset) const
{
    RawTensor t;
    t.dtype = checkedDType(dataset);
    KnownDataset& known = m_known[dataset];
    if (!known.scale) {
        float scale = 1.0f;
        if (m_file.hasAttribute(dataset, "scale")) {
            scale = float(m_file.readDoubleAttribute(dataset, "scale"));
            if (!(scale > 0.0f) || !std::isfinite(scale))
                m_file.fail(dataset, "scale " + std::to_string(scale) + " must be finite and positive");
        }
        known.scale = scale;
    }
    t.scale = *known.scale;
    return t;
}

RawTensor BundleReader::readTensor(const std::string& dataset, const std::vector<std::int64_t>& expectedShape,
                                   const std::vector<std::int64_t>* rows, std::vector<ChunkRowRead>& deferred,
                                   ValueRead values) const
{
    RawTensor t = storedAs(dataset);
    const DatasetInfo& info = datasetInfo(dataset);
    if (info.shape != expectedShape)
        m_file.fail(dataset, "shape " + shapeToString(info.shape) + ", expected " + shapeToString(expectedShape));
    t.shape = info.shape;
    if (rows)
        t.shape[0] = std::int64_t(rows->size());
    const std::int64_t elements = Hdf5File::elementCount(t.shape);
    if (elements < 0 || elements > kMaxTensorBytes / std::int64_t(dtypeSize(t.dtype)))
        m_file.fail(dataset, "declares " + shapeToString(info.shape) + ", too large to read");
    m_file.requirePlausibleSize(dataset, std::uint64_t(elements) * dtypeSize(t.dtype));
    if (values == ValueRead::LayoutOnly)
        return t;
    t.bytes.resize(std::size_t(t.numel()) * dtypeSize(t.dtype));
    if (!t.bytes.empty())
        m_file.readRaw(dataset, storageType(t.dtype), t.bytes.data(), rows, &deferred);
    return t;
}

namespace {

// What the last axis of a part holds, for messages: "head_size", or "c_kv: kv_lora_rank".
std::string widthMeaning(const KvCacheGroup& group, KvPart part)
{
    const std::string field = partWidthName(group, part);
    return group.specType == SpecType::Mla ? partLabel(group, part) + (": " + field) : field;
}

}  // namespace

std::vector<std::int64_t> BundleReader::engineShardShape(const PromptInfo& prompt, std::size_t snapshot,
                                                         const std::string& layer, KvPart part) const
{
    const int g = m_config.groupOf(layer);
    if (g < 0)
        throw BundleError(m_path, "layer '" + layer + "'", "belongs to no group of the config");
    const KvCacheGroup& group = m_config.groups[std::size_t(g)];
    const SnapshotInfo& snap = prompt.snapshots.at(snapshot);
    const std::int64_t stored = snap.subsetStored ? std::int64_t(snap.storedBlockIds.size()) : m_config.numBlocks;
    return {stored, group.numKvHeads, group.blockSize, group.partWidth(part)};
}

BlockTable BundleReader::readBlockTable(const std::string& promptId, std::size_t snapshot, std::size_t group) const
{
    const PromptInfo& p = prompt(promptId);
    const std::string dataset = bundle_path::blockTable(promptId, snapshot, group);
    requireData();
    std::lock_guard lock(hdf5Mutex());
    if (snapshot >= p.snapshots.size())
        m_file.fail(bundle_path::snapshot(promptId, snapshot), "no such snapshot");
    const DatasetInfo info = datasetInfo(dataset);
    if (info.typeClass != H5T_INTEGER || info.shape.size() != 2 ||
        info.shape[0] != std::int64_t(p.snapshots[snapshot].seqLens.size()) || info.shape[1] > kMaxSeq)
        m_file.fail(dataset, "must be integers [batch=" + std::to_string(p.snapshots[snapshot].seqLens.size()) +
                                 ", max_blocks], found shape " + shapeToString(info.shape));
    BlockTable table;
    table.rows = info.shape[0];
    table.cols = info.shape[1];
    for (std::int64_t id : m_file.readIntegers(dataset, std::int64_t(1) << 30)) {
        if (id < -1 || id > INT32_MAX)
            m_file.fail(dataset, "entry " + std::to_string(id) + " is neither a block id nor -1");
        table.entries.push_back(std::int32_t(id));
    }
    return table;
}

PagedShard BundleReader::readEngineShard(const std::string& promptId, std::size_t snapshot, int rank,
                                         const std::string& layer, KvPart part,
                                         const std::vector<std::int64_t>* blockIds, ValueRead values) const
{
    const PromptInfo& p = prompt(promptId);
    requireData();
    if (snapshot >= p.snapshots.size())
        throw BundleError(m_path, bundle_path::snapshot(promptId, snapshot), "no such snapshot");
    if (rank < 0 || rank >= m_config.tpSize)
        throw BundleError(m_path, bundle_path::snapshot(promptId, snapshot), "no TP rank " + std::to_string(rank));
    const SnapshotInfo& snap = p.snapshots[snapshot];
    const std::string dataset = bundle_path::engineKv(promptId, snapshot, rank, layer, kvPartName(part));
    const std::vector<std::int64_t> shape = engineShardShape(p, snapshot, layer, part);

    PagedShard shard;
    std::vector<std::int64_t> rows;
    if (blockIds) {
        // Where each stored id lies, by id: a long prompt asks for thousands of blocks out of as many.
        std::vector<std::pair<std::int64_t, std::int64_t>> storedRows;  // (id, row), first row of an id first
        if (snap.subsetStored) {
            for (std::size_t row = 0; row < snap.storedBlockIds.size(); ++row)
                storedRows.emplace_back(snap.storedBlockIds[row], std::int64_t(row));
            std::sort(storedRows.begin(), storedRows.end());
        }
        for (std::int64_t id : *blockIds) {
            if (!snap.subsetStored) {
                if (id >= 0 && id < m_config.numBlocks) {
                    rows.push_back(id);
                    shard.physicalIds.push_back(id);
                }
                continue;
            }
            const auto it = std::lower_bound(storedRows.begin(), storedRows.end(), std::pair{id, std::int64_t(0)});
            if (it != storedRows.end() && it->first == id) {
                rows.push_back(it->second);
                shard.physicalIds.push_back(id);
            }
        }
        // Rows are read in file order (each run of consecutive rows in one read): sort rows and ids together.
        std::vector<std::size_t> order(rows.size());
        for (std::size_t i = 0; i < order.size(); ++i)
            order[i] = i;
        std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return rows[a] < rows[b]; });
        std::vector<std::int64_t> sortedRows, sortedIds;
        for (std::size_t i : order) {
            if (!sortedRows.empty() && sortedRows.back() == rows[i])
                continue;
            sortedRows.push_back(rows[i]);
            sortedIds.push_back(shard.physicalIds[i]);
        }
        rows = std::move(sortedRows);
        shard.physicalIds = std::move(sortedIds);
    } else if (!snap.subsetStored) {
        for (std::int64_t id = 0; id < shape[0]; ++id)
            shard.physicalIds.push_back(id);
    } else {
        shard.physicalIds = snap.storedBlockIds;
    }
    // Every stored row wanted (the usual case when only referenced blocks were kept): one
    // plain read instead of a selection of single rows.
    const bool allRows = blockIds && std::int64_t(rows.size()) == shape[0] &&
                         (rows.empty() || (rows.front() == 0 && rows.back() == shape[0] - 1));
    std::vector<ChunkRowRead> reads;
    {
        std::lock_guard lock(hdf5Mutex());
        shard.blocks = readTensor(dataset, shape, blockIds && !allRows ? &rows : nullptr, reads, values);
        readScales(dataset, shape, blockIds && !allRows ? &rows : nullptr, shard.blocks);
    }
    for (const ChunkRowRead& read : reads)  // without the lock: another thread may use HDF5 meanwhile
        read.run();
    if (shard.blocks.dtype == DType::Float4E2M1 || shard.blocks.dtype == DType::Int4TokenHead)
        requireCodes(dataset, shard);
    return shard;
}

void BundleReader::requireCodes(const std::string& dataset, const PagedShard& shard) const
{
    const RawTensor& cache = shard.blocks;
    // 4-bit codes, one per byte: a larger byte is damage (or a packed cache), not a value.
    const auto it = std::find_if(cache.bytes.begin(), cache.bytes.end(), [](std::uint8_t b) { return b > 15; });
    if (it == cache.bytes.end())
        return;
    const std::int64_t e = it - cache.bytes.begin();
    const std::int64_t width = cache.shape[3], slots = cache.shape[2], heads = cache.shape[1];
    throw BundleError(m_path, dataset,
                      "code " + std::to_string(int(*it)) + " at physical block " +
                          std::to_string(shard.physicalIds.at(std::size_t(e / (width * slots * heads)))) +
                          ", head " + std::to_string(e / (width * slots) % heads) + ", slot " + std::to_string(e / width % slots) +
                          ", value " + std::to_string(e % width) + " is outside 0..15 (one " + dtypeName(cache.dtype) +
                          " code per byte)");
}

std::vector<std::uint8_t> BundleReader::readBytes(const std::string& path, const std::vector<std::int64_t>& shape,
                                                  bool isSigned, const std::vector<std::int64_t>* rows) const
{
    if (!m_file.exists(path))
        m_file.fail(path, "missing");
    const DatasetInfo info = datasetInfo(path);
    if (info.typeClass != H5T_INTEGER || info.typeSize != 1 || info.isSigned != isSigned)
        m_file.fail(path, std::string("must hold ") + (isSigned ? "int8" : "uint8") + " values, found a " +
                              std::to_string(info.typeSize) + "-byte " + (info.typeClass == H5T_INTEGER ? "integer" : "non-integer") +
                              " type" + (info.typeClass == H5T_INTEGER && info.isSigned != isSigned ? " of the other signedness" : ""));
    if (info.shape != shape)
        m_file.fail(path, "shape " + shapeToString(info.shape) + ", expected " + shapeToString(shape));
    std::vector<std::int64_t> kept = shape;
    if (rows)
        kept[0] = std::int64_t(rows->size());
    m_file.requirePlausibleSize(path, std::uint64_t(Hdf5File::elementCount(shape)));
    std::vector<std::uint8_t> bytes(std::size_t(Hdf5File::elementCount(kept)));
    std::vector<ChunkRowRead> reads;
    if (!bytes.empty())
        m_file.readRaw(path, isSigned ? H5T_STD_I8LE : H5T_STD_U8LE, bytes.data(), rows, &reads);
    for (const ChunkRowRead& read : reads)
        read.run();
    return bytes;
}

void BundleReader::readPackedScales(const std::string& dataset, const std::vector<std::int64_t>& shape,
                                    const std::vector<std::int64_t>* rows, RawTensor& cache) const
{
    const std::string path = dataset + "_scale";
    const std::vector<std::int64_t> perTokenHead{shape[0], shape[1], shape[2]};
    if (!m_file.exists(path))
        m_file.fail(path, std::string("missing: a ") + dtypeName(cache.dtype) + " cache cannot be decoded without its " +
                              (cache.dtype == DType::Float4E2M1 ? "e4m3 block scales" : "scales per token and head"));
    std::vector<ChunkRowRead> reads;
    if (cache.dtype == DType::Float4E2M1) {
        // The e4m3 bits of a scale per 16 values; the global scale is the cache's `scale`.
        const std::vector<std::int64_t> expected{shape[0], shape[1], shape[2], shape[3] / 16};
        const RawTensor scales = readTensor(path, expected, rows, reads);
        for (const ChunkRowRead& read : reads)
            read.run();
        if (scales.dtype != DType::Float8E4M3)
            m_file.fail(path, "nvfp4 block scales must be float8_e4m3fn bits, found " + dtypeName(scales.dtype));
        for (std::size_t i = 0; i < scales.bytes.size(); ++i) {
            const std::uint8_t bits = scales.bytes[i];
            if ((bits & 0x7f) == 0x7f || ((bits & 0x80) && bits != 0x80))
                m_file.fail(path, "block scale " + std::to_string(i) + " is " + ((bits & 0x7f) == 0x7f ? "NaN" : "negative") +
                                      " (e4m3 bits 0x" + "0123456789abcdef"[bits >> 4] + "0123456789abcdef"[bits & 15] + ")");
        }
        const float global = cache.scale;
        cache.setScales(ScaleGranularity::TokenGroup, scales.toFloat());
        cache.scale = global;
        return;
    }
    // int4 per token and head: float32 scales, uint8 zero points, the rotation's signs.
    if (cache.scale != 1.0f)
        m_file.fail(dataset, "an int4_per_token_head cache is scaled per token and head (k_scale / v_scale); its 'scale' "
                             "attribute must be 1");
    cache.setScales(ScaleGranularity::TokenHead, readFloatScales(path, perTokenHead, rows, false));
    const std::string zeroPath = dataset + "_zero_point";
    cache.zeroPoints = readBytes(zeroPath, perTokenHead, false, rows);
    for (std::size_t i = 0; i < cache.zeroPoints.size(); ++i)
        if (cache.zeroPoints[i] > 15)
            m_file.fail(zeroPath, "zero point " + std::to_string(int(cache.zeroPoints[i])) + " (element " + std::to_string(i) +
                                      ") is outside 0..15");
    const std::string signsPath = dataset.substr(0, dataset.rfind('/')) + "/rht_signs";
    const std::vector<std::uint8_t> signs = readBytes(signsPath, {shape[3]}, true, nullptr);
    cache.rhtSigns.clear();
    for (std::uint8_t b : signs) {
        const auto sign = std::int8_t(b);
        if (sign != 1 && sign != -1)
            m_file.fail(signsPath, "holds " + std::to_string(int(sign)) + "; the rotation's signs are +1 or -1");
        cache.rhtSigns.push_back(sign);
    }
}

void BundleReader::readScales(const std::string& dataset, const std::vector<std::int64_t>& shape,
                              const std::vector<std::int64_t>* rows, RawTensor& cache) const
{
    if (cache.dtype == DType::Float4E2M1 || cache.dtype == DType::Int4TokenHead) {
        readPackedScales(dataset, shape, rows, cache);
        return;
    }
    const std::string path = dataset + "_scale";
    if (!m_file.exists(path))
        return;
    if (!isQuantised(cache.dtype))
        m_file.fail(path, "scales for a " + dtypeName(cache.dtype) + " cache, which is not quantised");
    if (cache.scale != 1.0f)
        m_file.fail(path, "given beside the cache's scalar 'scale' attribute; keep one of them");
    const DatasetInfo info = datasetInfo(path);
    const std::vector<std::int64_t> perHead{shape[1]}, perTokenHead{shape[0], shape[1], shape[2]};
    const bool tokenHead = info.shape == perTokenHead;
    // Per run of values in a token's head (fp8_ds_mla: [blocks, 1, block_size, head_dim / 128]).
    const bool tokenGroup = info.shape.size() == 4 && std::equal(perTokenHead.begin(), perTokenHead.end(), info.shape.begin()) &&
                            info.shape[3] >= 1 && info.shape[3] <= shape[3] && shape[3] % info.shape[3] == 0;
    if (info.shape != perHead && !tokenHead && !tokenGroup)
        m_file.fail(path, "shape " + shapeToString(info.shape) + ": scales are per head " + shapeToString(perHead) +
                              ", per token and head " + shapeToString(perTokenHead) +
                              " or per group of a token's values [..., groups dividing " + std::to_string(shape[3]) + "]");
    cache.setScales(tokenGroup  ? ScaleGranularity::TokenGroup
                    : tokenHead ? ScaleGranularity::TokenHead
                                : ScaleGranularity::Head,
                    readFloatScales(path, info.shape, tokenHead || tokenGroup ? rows : nullptr, true));
}

std::vector<float> BundleReader::readFloatScales(const std::string& path, const std::vector<std::int64_t>& shape,
                                                 const std::vector<std::int64_t>* rows, bool zeroAllowed) const
{
    std::vector<ChunkRowRead> reads;  // small: read now, not with the cache's deferred reads
    const RawTensor scales = readTensor(path, shape, rows, reads);
    for (const ChunkRowRead& read : reads)
        read.run();
    if (scales.dtype != DType::Float32)
        m_file.fail(path, "scales must be float32, found " + dtypeName(scales.dtype));
    std::vector<float> values = scales.toFloat();
    for (float v : values)
        if (!(zeroAllowed ? v >= 0.0f : v > 0.0f) || !std::isfinite(v))
            m_file.fail(path, "scale " + std::to_string(v) + (zeroAllowed ? " must be finite and not negative"
                                                                          : " must be finite and positive"));
    return values;
}

std::vector<std::int64_t> BundleReader::referenceShape(const std::string& dataset, const std::string& layer,
                                                       KvPart part) const
{
    const int g = m_config.groupOf(layer);
    if (g < 0)
        m_file.fail(dataset, "layer belongs to no group of the config");
    const DatasetInfo info = datasetInfo(dataset);
    if (info.shape.size() != 4)
        m_file.fail(dataset, "shape " + shapeToString(info.shape) + " must be [batch, heads, seq, head_dim]");
    const int width = m_config.groups[std::size_t(g)].partWidth(part);
    const std::vector<std::int64_t> expected{info.shape[0], m_config.groups[std::size_t(g)].totalKvHeads, info.shape[2], width};
    if (info.shape != expected || info.shape[0] < 1 || info.shape[0] > kMaxBatch || info.shape[2] > kMaxSeq)
        m_file.fail(dataset, "shape " + shapeToString(info.shape) + " disagrees with the config: expected [batch, " +
                                 std::to_string(m_config.groups[std::size_t(g)].totalKvHeads) + ", seq, " + std::to_string(width) + "] (" +
                                 widthMeaning(m_config.groups[std::size_t(g)], part) + ")");
    return info.shape;
}

BundleReader::ReferenceDatasets BundleReader::referenceDatasets(const std::string& promptId, ReferenceRole role,
                                                                const std::string& layer) const
{
    ReferenceDatasets d;
    const std::string rolePath = bundle_path::referenceRole(promptId, role);
    d.batchRow = m_file.hasAttribute(rolePath, "batch_row") ? m_file.readIntAttribute(rolePath, "batch_row") : 0;
    for (KvPart part : {KvPart::K, KvPart::V}) {
        const std::size_t i = std::size_t(part);
        d.paths[i] = bundle_path::referenceKv(promptId, role, layer, kvPartName(part));
        d.shapes[i] = referenceShape(d.paths[i], layer, part);
        m_file.requirePlausibleSize(d.paths[i], std::uint64_t(Hdf5File::elementCount(d.shapes[i])) *
                                                    dtypeSize(checkedDType(d.paths[i])));
    }
    if (!std::equal(d.shapes[0].begin(), d.shapes[0].end() - 1, d.shapes[1].begin()))
        m_file.fail(d.paths[1], "shape " + shapeToString(d.shapes[1]) + " differs from k's " + shapeToString(d.shapes[0]) +
                                    " in batch, heads or seq");
    return d;
}

BundleReader::Reference BundleReader::readReference(const std::string& promptId, ReferenceRole role,
                                                    const std::string& layer, ValueRead values) const
{
    prompt(promptId);
    requireData();
    Reference ref;
    std::vector<ChunkRowRead> reads;
    {
        std::lock_guard lock(hdf5Mutex());
        const ReferenceDatasets d = referenceDatasets(promptId, role, layer);
        ref.batchRow = d.batchRow;
        ref.k = readTensor(d.paths[0], d.shapes[0], nullptr, reads, values);
        ref.v = readTensor(d.paths[1], d.shapes[1], nullptr, reads, values);
    }
    for (const ChunkRowRead& read : reads)
        read.run();
    return ref;
}

BundleReader::Reference BundleReader::readReferenceRows(const std::string& promptId, ReferenceRole role,
                                                        const std::string& layer, std::int64_t firstRow,
                                                        std::int64_t endRow, ValueRead values) const
{
    prompt(promptId);
    requireData();
    Reference ref;
    std::lock_guard lock(hdf5Mutex());
    const ReferenceDatasets d = referenceDatasets(promptId, role, layer);
    ref.batchRow = d.batchRow;
    const std::int64_t batch = d.shapes[0][0], seq = d.shapes[0][2];
    firstRow = std::clamp<std::int64_t>(firstRow, 0, seq);
    endRow = std::clamp<std::int64_t>(endRow, firstRow, seq);
    if (ref.batchRow < 0 || ref.batchRow >= batch)  // alignment names it; nothing to read
        endRow = firstRow;
    ref.slab = ReferenceSlab{batch, seq, firstRow};
    auto read = [&](const std::string& path, const std::vector<std::int64_t>& shape) {
        RawTensor t = storedAs(path);
        t.shape = {1, shape[1], endRow - firstRow, shape[3]};
        if (values == ValueRead::LayoutOnly)
            return t;
        t.bytes.resize(std::size_t(t.numel()) * dtypeSize(t.dtype));
        if (!t.bytes.empty())
            m_file.readSlab(path, storageType(t.dtype), t.bytes.data(), {ref.batchRow, 0, firstRow, 0}, t.shape);
        return t;
    };
    ref.k = read(d.paths[0], d.shapes[0]);
    ref.v = read(d.paths[1], d.shapes[1]);
    return ref;
}

BundleReader::ReferenceExtent BundleReader::referenceExtent(const std::string& promptId, ReferenceRole role,
                                                            const std::string& layer) const
{
    prompt(promptId);
    requireData();
    std::lock_guard lock(hdf5Mutex());
    const ReferenceDatasets d = referenceDatasets(promptId, role, layer);
    ReferenceExtent extent;
    extent.seq = d.shapes[0][2];
    for (const std::string& path : d.paths)
        if (const std::vector<std::int64_t> chunk = datasetInfo(path).chunk; chunk.size() == 4)
            extent.positionsPerChunk = std::max(extent.positionsPerChunk, std::min(chunk[2], extent.seq));
    return extent;
}

Logits BundleReader::readLogits(const std::string& promptId, LogitsRole role) const
{
    prompt(promptId);
    requireData();
    std::lock_guard lock(hdf5Mutex());
    const std::string dataset = bundle_path::logits(promptId, role);
    const DatasetInfo info = datasetInfo(dataset);
    if (info.shape.size() != 2 || info.shape[0] > kMaxSeq || info.shape[1] > kMaxVocab || info.shape[1] < 1)
        m_file.fail(dataset, "shape " + shapeToString(info.shape) + " must be [steps, vocab]");
    Logits logits;
    logits.steps = info.shape[0];
    logits.vocab = info.shape[1];
    logits.values = m_file.readFloats(dataset);
    for (float v : logits.values)
        if (!std::isfinite(v))
            m_file.fail(dataset, "holds NaN or infinity: argmax (divergences) would be meaningless");
    return logits;
}

std::optional<ImpactRecord> BundleReader::readImpact(const std::string& promptId) const
{
    if (!prompt(promptId).hasImpact)
        return std::nullopt;
    requireData();
    std::lock_guard lock(hdf5Mutex());
    return kvscope::readImpact(m_file, promptId, m_config.layerNames());
}

std::vector<StatePart> BundleReader::readStateParts(const std::string& group, bool engine,
                                                   std::vector<ChunkRowRead>& reads, bool values) const
{
    constexpr const char* kUnits = "_units";
    std::vector<StatePart> parts;
    for (const std::string& name : m_file.children(group)) {
        const bool isUnits = name.size() > 6 && name.compare(name.size() - 6, 6, kUnits) == 0;
        if (name == "positions" || (engine && isUnits))
            continue;
        StatePart part;
        part.name = name;
        const std::string path = group + "/" + name;
        const DatasetInfo info = datasetInfo(path);
        if (info.shape.size() < 2 || info.shape.size() > 6)
            m_file.fail(path, "shape " + shapeToString(info.shape) + " is not [checkpoints, units, ...]");
        if (values) {
            part.tensor = readTensor(path, info.shape, nullptr, reads);
        } else {
            part.tensor = storedAs(path);
            part.tensor.shape = info.shape;
        }
        if (!isStateDType(part.tensor.dtype))
            m_file.fail(path, "dtype " + dtypeName(part.tensor.dtype) + ": a state is float32, bfloat16 or float16");
        if (engine) {
            if (!m_file.exists(path + kUnits))
                m_file.fail(path + kUnits, "missing: which units of the model this rank's rows are");
            part.units = m_file.readIntegers(path + kUnits, info.shape[1]);
        }
        parts.push_back(std::move(part));
    }
    return parts;
}

LayerStateRecord BundleReader::readEngineState(const std::string& promptId, const std::string& layer) const
{
    return readEngineState(promptId, layer, true);
}

LayerStateRecord BundleReader::readEngineStateLayout(const std::string& promptId, const std::string& layer) const
{
    return readEngineState(promptId, layer, false);
}

LayerStateRecord BundleReader::readEngineState(const std::string& promptId, const std::string& layer, bool values) const
{
    prompt(promptId);
    requireData();
    LayerStateRecord state;
    state.layer = layer;
    std::vector<ChunkRowRead> reads;
    const std::string path = bundle_path::engineState(promptId, layer);
    {
        std::lock_guard lock(hdf5Mutex());
        if (!m_file.isGroup(path))
            m_file.fail(path, "missing");
        const int g = m_config.groupOf(layer);
        if (g < 0 || m_config.groups[std::size_t(g)].specName != "MambaSpec")
            m_file.fail(path, "layer '" + layer + "' is in no MambaSpec group of the config");
        if (m_file.hasAttribute(path, "kind"))
            state.kind = m_file.readStringAttribute(path, "kind");
        const std::int64_t tpSize = m_file.readIntAttribute(path, "tp_size");
        if (tpSize < 1 || tpSize > 4096)
            m_file.fail(path, "tp_size " + std::to_string(tpSize) + " is not plausible");
        state.positions = m_file.readIntegers(path + "/positions", kMaxSeq);
        for (std::int64_t r = 0; r < tpSize; ++r) {
            const std::string rankPath = path + "/rank_" + std::to_string(r);
            if (!m_file.isGroup(rankPath))
                m_file.fail(rankPath, "missing: tp_size is " + std::to_string(tpSize));
            state.ranks.push_back(readStateParts(rankPath, true, reads, values));
        }
        if (!values) {  // (the checks need the bytes: analyze and check make them)
        } else if (const std::string problem = stateRecordProblem(state, true); !problem.empty()) {
            m_file.fail(path, problem);
        }
    }
    for (const ChunkRowRead& read : reads)
        read.run();
    return state;
}

std::optional<LayerStateRecord> BundleReader::readReferenceState(const std::string& promptId, ReferenceRole role,
                                                                 const std::string& layer) const
{
    return readReferenceState(promptId, role, layer, true);
}

std::optional<LayerStateRecord> BundleReader::readReferenceStateLayout(const std::string& promptId, ReferenceRole role,
                                                                       const std::string& layer) const
{
    return readReferenceState(promptId, role, layer, false);
}

std::optional<LayerStateRecord> BundleReader::readReferenceState(const std::string& promptId, ReferenceRole role,
                                                                 const std::string& layer, bool values) const
{
    prompt(promptId);
    requireData();
    LayerStateRecord state;
    state.layer = layer;
    std::vector<ChunkRowRead> reads;
    const std::string path = bundle_path::referenceState(promptId, role, layer);
    {
        std::lock_guard lock(hdf5Mutex());
        if (!m_file.isGroup(path))
            return std::nullopt;
        state.positions = m_file.readIntegers(path + "/positions", kMaxSeq);
        state.ranks.push_back(readStateParts(path, false, reads, values));
        if (!values) {
        } else if (const std::string problem = stateRecordProblem(state, false); !problem.empty()) {
            m_file.fail(path, problem);
        }
    }
    for (const ChunkRowRead& read : reads)
        read.run();
    return state;
}

std::vector<std::string> BundleReader::validate() const
{
    requireData();
    std::vector<std::string> problems;
    auto check = [&](auto&& fn) {
        try {
            fn();
        } catch (const BundleError& e) {
            problems.push_back(e.what());
        }
    };
    std::lock_guard lock(hdf5Mutex());
    for (const PromptInfo& p : m_prompts) {
        problems.insert(problems.end(), p.problems.begin(), p.problems.end());
        // An engine-only capture's prompt lacks only its reference: its engine data is checked.
        if (!p.problems.empty() && !(m_metadata.engineOnly && p.referenceMissing && p.problems.size() == 1))
            continue;
        for (std::size_t s = 0; s < p.snapshots.size(); ++s) {
            for (std::size_t g = 0; g < m_config.groups.size(); ++g)
                check([&] {
                    const std::string dataset = bundle_path::blockTable(p.id, s, g);
                    const DatasetInfo info = datasetInfo(dataset);
                    if (info.typeClass != H5T_INTEGER || info.shape.size() != 2 ||
                        info.shape[0] != std::int64_t(p.snapshots[s].seqLens.size()))
                        m_file.fail(dataset, "must be integers [batch, max_blocks], found " + shapeToString(info.shape));
                });
            for (int r = 0; r < m_config.tpSize; ++r)
                for (const std::string& layer : m_config.layerNames())
                    for (KvPart part : {KvPart::K, KvPart::V})
                        check([&] {
                            const std::string dataset = bundle_path::engineKv(p.id, s, r, layer, kvPartName(part));
                            const DType dtype = checkedDType(dataset);
                            const std::vector<std::int64_t> shape = engineShardShape(p, s, layer, part);
                            const DatasetInfo& info = datasetInfo(dataset);
                            if (info.shape != shape)
                                m_file.fail(dataset, "shape " + shapeToString(info.shape) + ", the config implies " +
                                                         shapeToString(shape) + " ([blocks, heads_per_rank, block_size, " +
                                                         widthMeaning(m_config.groups[std::size_t(m_config.groupOf(layer))], part) + "])");
                            // What a 4-bit cache cannot be decoded without (its values are read with the cache).
                            std::vector<std::pair<std::string, std::vector<std::int64_t>>> needed;
                            if (dtype == DType::Float4E2M1)
                                needed = {{dataset + "_scale", {shape[0], shape[1], shape[2], shape[3] / 16}}};
                            if (dtype == DType::Int4TokenHead)
                                needed = {{dataset + "_scale", {shape[0], shape[1], shape[2]}},
                                          {dataset + "_zero_point", {shape[0], shape[1], shape[2]}},
                                          {dataset.substr(0, dataset.rfind('/')) + "/rht_signs", {shape[3]}}};
                            for (const auto& [path, expected] : needed) {
                                if (!m_file.exists(path))
                                    m_file.fail(path, "missing: the " + dtypeName(dtype) + " cache " + dataset + " needs it");
                                if (const DatasetInfo d = datasetInfo(path); d.shape != expected)
                                    m_file.fail(path, "shape " + shapeToString(d.shape) + ", expected " + shapeToString(expected));
                            }
                        });
        }
        for (ReferenceRole role : {ReferenceRole::Expected, ReferenceRole::Baseline}) {
            if ((role == ReferenceRole::Baseline && !p.hasBaseline) || (role == ReferenceRole::Expected && p.referenceMissing))
                continue;
            for (const std::string& layer : m_config.layerNames())
                for (KvPart part : {KvPart::K, KvPart::V})
                    check([&] {
                        const std::string dataset = bundle_path::referenceKv(p.id, role, layer, kvPartName(part));
                        checkedDType(dataset);
                        referenceShape(dataset, layer, part);
                    });
        }
    }
    return problems;
}

}  // namespace kvscope
