#pragma once
// Rows of a chunked dataset read straight from their chunks' places in the file, in two
// steps: where each chunk lies is asked of HDF5 (under its lock), and the reads themselves
// (preadv, and the Fletcher32 check of checksummed chunks) run without HDF5, so that one
// thread reads while another holds the lock.

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace kvscope {

// The file opened plainly, read-only, beside HDF5's handle.
struct PlainFile {
    int fd = -1;
    std::uint64_t base = 0;  // where HDF5 addresses start (after a user block)
    std::uint64_t bytes = 0;  // its size when opened
    PlainFile() = default;
    PlainFile(const PlainFile&) = delete;
    PlainFile& operator=(const PlainFile&) = delete;
    ~PlainFile();
};

// A dataset stored in chunks of whole rows (along dimension 0), each as the memory type wants
// its bytes, unfiltered or with just the Fletcher32 checksum appended.
struct RowChunking {
    std::size_t rowBytes = 0;
    std::uint64_t chunkRows = 0;
    std::uint64_t totalRows = 0;  // the last chunk may be padded past them
    bool checksummed = false;
};

// The wanted rows (sorted) grouped by the chunk that holds them: rows[begin, end) lie in the
// chunk whose first row is `firstRow`.
struct ChunkRun {
    std::uint64_t firstRow;
    std::size_t begin, end;
};
std::vector<ChunkRun> chunkRuns(const std::vector<std::int64_t>& rows, std::uint64_t chunkRows);

class ChunkRowRead {
public:
    // Rows `rows` (sorted, unique, in range) into `out` (rows.size() * rowBytes), one after another.
    ChunkRowRead(std::shared_ptr<const PlainFile> file, std::string path, std::string dataset, RowChunking chunking,
                 std::vector<std::int64_t> rows, unsigned char* out);
    // The chunks the rows touch, in order; where each lies must be set (HDF5's addresses,
    // before the user block), one per chunk, before run().
    const std::vector<ChunkRun>& chunks() const { return m_chunks; }
    void setAddresses(std::vector<std::uint64_t> addresses) { m_addresses = std::move(addresses); }
    // Reads (and verifies) every row; throws BundleError naming the file, the dataset and the
    // chunk when one lies past the end of the file or fails its checksum.
    void run() const;

private:
    std::shared_ptr<const PlainFile> m_file;
    std::string m_path;
    std::string m_dataset;
    RowChunking m_chunking;
    std::vector<std::int64_t> m_rows;
    std::vector<ChunkRun> m_chunks;
    unsigned char* m_out;
    std::vector<std::uint64_t> m_addresses;
};

}  // namespace kvscope
