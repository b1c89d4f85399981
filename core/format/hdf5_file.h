#pragma once
// A thin RAII layer over the HDF5 C API. Every failure becomes a BundleError that names
// the file and the object. Not thread-safe: callers serialise access (see BundleReader).

#include "format/chunk_row_read.h"
#include "format/dtype.h"

#include <hdf5.h>

#include <cstdint>
#include <optional>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_set>
#include <vector>

namespace kvscope {

// HDF5 is not thread-safe in every build: one lock for every reader and writer of the process
// (bundles read while a results file is written).
std::mutex& hdf5Mutex();

// Owns one HDF5 identifier and closes it with the matching H5*close function.
class Hdf5Handle {
public:
    using Closer = herr_t (*)(hid_t);
    Hdf5Handle() = default;
    Hdf5Handle(hid_t id, Closer closer) : m_id(id), m_closer(closer) {}
    Hdf5Handle(Hdf5Handle&& other) noexcept : m_id(other.m_id), m_closer(other.m_closer) { other.m_id = -1; }
    Hdf5Handle& operator=(Hdf5Handle&& other) noexcept;
    Hdf5Handle(const Hdf5Handle&) = delete;
    Hdf5Handle& operator=(const Hdf5Handle&) = delete;
    ~Hdf5Handle();
    hid_t id() const { return m_id; }
    bool valid() const { return m_id >= 0; }

private:

    hid_t m_id = -1;
    Closer m_closer = nullptr;
};

struct DatasetInfo {
    std::vector<std::int64_t> shape;
    H5T_class_t typeClass = H5T_NO_CLASS;
    std::size_t typeSize = 0;
    bool isSigned = false;
    std::vector<std::int64_t> chunk;  // the chunks' extents; empty when not chunked
};

class Hdf5File {
public:
    static Hdf5File openReadOnly(const std::string& path);
    static Hdf5File create(const std::string& path);  // truncates
    // An existing file opened to add to it (a record computed after the capture: its impact).
    static Hdf5File openForUpdate(const std::string& path);

    const std::string& path() const { return m_path; }
    bool isOpen() const { return m_file.valid(); }
    // Format v2's promise, enforced on every read once set: each dataset with data is chunked
    // with a Fletcher32 checksum, and strings are fixed-length (no global-heap reads).
    void setChecksumsRequired(bool required) { m_checksumsRequired = required; }
    // Refuses a dataset that declares more bytes than the file holds (before allocating them).
    void requirePlausibleSize(const std::string& dataset, std::uint64_t bytes) const;

    bool exists(const std::string& object) const;
    bool isGroup(const std::string& object) const;
    std::vector<std::string> children(const std::string& group) const;  // in creation order

    bool hasAttribute(const std::string& object, const std::string& name) const;
    std::vector<std::string> attributeNames(const std::string& object) const;
    std::string readStringAttribute(const std::string& object, const std::string& name) const;
    std::int64_t readIntAttribute(const std::string& object, const std::string& name) const;
    double readDoubleAttribute(const std::string& object, const std::string& name) const;

    DatasetInfo datasetInfo(const std::string& dataset) const;
    std::string readString(const std::string& dataset) const;  // scalar string
    std::vector<std::string> readStrings(const std::string& dataset) const;  // 1-D strings
    // Whole datasets, refusing more than `maxElements` (declared sizes are not trusted).
    std::vector<std::int64_t> readIntegers(const std::string& dataset, std::int64_t maxElements = 1 << 26) const;
    std::vector<float> readFloats(const std::string& dataset, std::int64_t maxElements = std::int64_t(1) << 30) const;
    // The element count of a shape, or -1 when it overflows.
    static std::int64_t elementCount(const std::vector<std::int64_t>& shape);
    // Reads a whole dataset, or the rows `rows` (sorted ascending, along dimension 0),
    // into `dst` without conversion: `memType` must describe the stored type. Checksums are
    // verified (by HDF5, or here when chunks are read straight from the file). With
    // `deferred`, reads straight from the file are appended there instead, to be run later
    // (without the HDF5 lock; the file must stay open until then).
    void readRaw(const std::string& dataset, hid_t memType, void* dst, const std::vector<std::int64_t>* rows = nullptr,
                 std::vector<ChunkRowRead>* deferred = nullptr) const;

    // The box [start, start + count) of a dataset, into `dst` (count's elements, row-major)
    // without conversion: what a window of tokens needs of a reference chunked along its
    // positions (HDF5 reads and verifies only the chunks the box touches).
    void readSlab(const std::string& dataset, hid_t memType, void* dst, const std::vector<std::int64_t>& start,
                  const std::vector<std::int64_t>& count) const;

    void createGroup(const std::string& group);
    void remove(const std::string& object);  // unlinks it (its space is not reclaimed)
    void writeStringAttribute(const std::string& object, const std::string& name, const std::string& value);
    void writeIntAttribute(const std::string& object, const std::string& name, std::int64_t value);
    void writeDoubleAttribute(const std::string& object, const std::string& name, double value);
    void writeString(const std::string& dataset, const std::string& value);
    void writeStrings(const std::string& dataset, const std::vector<std::string>& values);
    // Writes a dataset of `shape` from `src`, stored with `fileType` (memory layout identical),
    // in checksummed chunks of `chunkRows` rows of dimension 0 (when > 0; else ~1 MiB).
    void writeRaw(const std::string& dataset, hid_t fileType, const std::vector<std::int64_t>& shape,
                  const void* src, std::int64_t chunkRows = 0);
    // The same in checksummed chunks of `chunk` (one extent per dimension, clipped to the shape).
    void writeRawChunked(const std::string& dataset, hid_t fileType, const std::vector<std::int64_t>& shape,
                         const void* src, const std::vector<std::int64_t>& chunk);

    // A float32 dataset of `shape` (all NaN until written), for results written piece by piece:
    // chunks of `chunk`, shuffled and deflated, each with its checksum, so that one window reads
    // without the rest.
    void createCompressedFloats(const std::string& dataset, const std::vector<std::int64_t>& shape,
                                const std::vector<std::int64_t>& chunk);
    // One chunk, its bytes already through the dataset's filters, at element `offset` (the
    // chunk's first element, a multiple of the chunk dims).
    void writeChunk(const std::string& dataset, const std::vector<std::int64_t>& offset,
                    const std::vector<unsigned char>& bytes);

    [[noreturn]] void fail(const std::string& object, const std::string& problem) const;
    // A BundleError naming `dataset` when the file is shorter than when it was opened.
    void requireNotShrunk(const std::string& dataset) const;

private:
    // readRaw's fast paths, when chunks hold whole rows, unfiltered or checksummed, in the
    // memory type: how (nothing when the dataset is not laid out so); the wanted rows' chunks
    // located, to be read straight from the file; or read one by one through libhdf5.
    std::optional<RowChunking> rowChunking(hid_t dataset, hid_t memType, const std::vector<hsize_t>& dims,
                                           std::size_t rowBytes) const;
    ChunkRowRead planChunkReads(hid_t dataset, const RowChunking& chunking, const std::vector<std::int64_t>& rows,
                                unsigned char* out, const std::string& name, int rank) const;
    void readChunksDirect(hid_t dataset, const RowChunking& chunking, const std::vector<std::int64_t>& rows,
                          unsigned char* out, const std::string& name, int rank) const;
    void readWhole(hid_t dataset, hid_t memType, void* dst, const std::string& name) const;
    void requireChecksummed(hid_t dataset, const std::string& name) const;
    std::uint64_t fileSize() const;
    Hdf5Handle openObject(const std::string& object) const;
    Hdf5Handle openDataset(const std::string& dataset) const;
    // Opened for its data: checksummed when required, and fully written.
    Hdf5Handle openForReading(const std::string& dataset) const;
    Hdf5Handle openAttribute(const std::string& object, const std::string& name) const;

    std::string m_path;
    Hdf5Handle m_file;
    std::shared_ptr<PlainFile> m_raw;  // the same file opened plainly, for the fast path
    bool m_checksumsRequired = false;
    // Paths found to exist (nothing here is ever deleted): exists() asks libhdf5 about each
    // prefix of a path, each walked from the root, and a read asks it several times per
    // dataset. Under the HDF5 lock, as every call is.
    mutable std::unordered_set<std::string> m_existing;
};

// The HDF5 type a dtype is stored as: float32 as IEEE float, float16 as a 16-bit IEEE float
// (as h5py writes numpy float16), bfloat16 as uint16, fp8 as uint8.
hid_t storageType(DType dtype);

}  // namespace kvscope
