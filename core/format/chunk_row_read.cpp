#include "format/chunk_row_read.h"

#include "format/bundle_error.h"
#include "format/fletcher32.h"

#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace kvscope {

PlainFile::~PlainFile()
{
    if (fd >= 0)
        ::close(fd);
}

namespace {

// Reads exactly the iovecs' bytes at `at`, or returns false (end of file, I/O error).
bool preadFully(int fd, iovec* parts, int count, off_t at)
{
    while (count > 0) {
        const ssize_t n = ::preadv(fd, parts, count, at);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return false;
        at += n;
        for (std::size_t left = std::size_t(n); left > 0 && count > 0;) {
            const std::size_t step = std::min(left, parts->iov_len);
            parts->iov_base = static_cast<char*>(parts->iov_base) + step;
            parts->iov_len -= step;
            left -= step;
            if (parts->iov_len == 0) {
                ++parts;
                --count;
            }
        }
    }
    return true;
}

// Checksummed chunks that land straight in the output, adjacent in the file: read by one
// preadv (data and checksum of each in turn), then verified.
class ChunkBatch {
public:
    explicit ChunkBatch(int fd) : m_fd(fd) {}
    bool fits(off_t at) const { return m_chunks.empty() || (at == m_end && m_chunks.size() < kMaxChunks); }
    void add(off_t at, unsigned char* data, std::size_t bytes, std::uint64_t row)
    {
        if (m_chunks.empty())
            m_start = at;
        m_chunks.push_back({data, bytes, row});
        m_end = at + off_t(bytes + 4);
    }
    // Reads and verifies; on failure `problem` says what and the first bad chunk's row.
    bool flush(std::string& problem)
    {
        if (m_chunks.empty())
            return true;
        m_sums.resize(m_chunks.size() * 4);
        m_parts.clear();
        for (std::size_t k = 0; k < m_chunks.size(); ++k) {
            m_parts.push_back({m_chunks[k].data, m_chunks[k].bytes});
            m_parts.push_back({m_sums.data() + 4 * k, 4});
        }
        if (!preadFully(m_fd, m_parts.data(), int(m_parts.size()), m_start)) {
            problem = "chunk at row " + std::to_string(m_chunks.front().row) + " lies beyond the end of the file (truncated?)";
            return false;
        }
        for (std::size_t k = 0; k < m_chunks.size(); ++k)
            if (!fletcher32Matches(m_chunks[k].data, m_chunks[k].bytes, m_sums.data() + 4 * k)) {
                problem = "chunk at row " + std::to_string(m_chunks[k].row) +
                          " does not match its Fletcher32 checksum: the file is corrupt";
                return false;
            }
        m_chunks.clear();
        return true;
    }

private:
    static constexpr std::size_t kMaxChunks = 256;  // two iovecs each, within IOV_MAX
    struct Chunk {
        unsigned char* data;
        std::size_t bytes;
        std::uint64_t row;
    };
    int m_fd;
    off_t m_start = 0, m_end = 0;
    std::vector<Chunk> m_chunks;
    std::vector<unsigned char> m_sums;
    std::vector<iovec> m_parts;
};

}  // namespace

ChunkRowRead::ChunkRowRead(std::shared_ptr<const PlainFile> file, std::string path, std::string dataset,
                           RowChunking chunking, std::vector<std::int64_t> rows, unsigned char* out)
    : m_file(std::move(file))
    , m_path(std::move(path))
    , m_dataset(std::move(dataset))
    , m_chunking(chunking)
    , m_rows(std::move(rows))
    , m_out(out)
{
}

std::vector<std::uint64_t> ChunkRowRead::chunksNeeded() const
{
    std::vector<std::uint64_t> firstRows;
    for (std::int64_t row : m_rows) {
        const std::uint64_t first = std::uint64_t(row) / m_chunking.chunkRows * m_chunking.chunkRows;
        if (firstRows.empty() || firstRows.back() != first)
            firstRows.push_back(first);
    }
    return firstRows;
}

void ChunkRowRead::run() const
{
    const RowChunking& c = m_chunking;
    const std::size_t chunkBytes = std::size_t(c.chunkRows) * c.rowBytes;
    const std::size_t storedBytes = chunkBytes + (c.checksummed ? 4 : 0);
    std::vector<unsigned char> scratch;
    ChunkBatch batch(m_file->fd);
    std::string problem;
    const auto fail = [&](const std::string& what) { throw BundleError(m_path, m_dataset, what); };
    std::size_t chunkIndex = 0;
    for (std::size_t i = 0; i < m_rows.size(); ++chunkIndex) {
        const std::uint64_t firstRow = std::uint64_t(m_rows[i]) / c.chunkRows * c.chunkRows;
        // Only built when something fails: this runs once per block read.
        const auto where = [&] { return "chunk at row " + std::to_string(firstRow); };
        const off_t at = off_t(m_file->base + m_addresses.at(chunkIndex));
        std::size_t end = i;  // the wanted rows in this chunk: [i, end)
        while (end < m_rows.size() && std::uint64_t(m_rows[end]) / c.chunkRows * c.chunkRows == firstRow)
            ++end;
        if (!c.checksummed) {
            // Each run of consecutive wanted rows: one read, straight into place.
            for (std::size_t first = i; first < end;) {
                std::size_t last = first;
                while (last + 1 < end && m_rows[last + 1] == m_rows[last] + 1)
                    ++last;
                iovec part{m_out + first * c.rowBytes, (last - first + 1) * c.rowBytes};
                if (!preadFully(m_file->fd, &part, 1, at + off_t((std::uint64_t(m_rows[first]) - firstRow) * c.rowBytes)))
                    fail(where() + " lies beyond the end of the file (truncated?)");
                first = last + 1;
            }
        } else if (end - i == c.chunkRows && firstRow + c.chunkRows <= c.totalRows) {
            // A whole chunk wanted: its rows go straight into place, with its neighbours'.
            if (!batch.fits(at) && !batch.flush(problem))
                fail(problem);
            batch.add(at, m_out + i * c.rowBytes, chunkBytes, firstRow);
        } else {
            // Part of a chunk (or an edge chunk, padded to full size): the checksum covers all
            // of it, so all of it is read, aside.
            scratch.resize(storedBytes);
            iovec part{scratch.data(), storedBytes};
            if (!preadFully(m_file->fd, &part, 1, at))
                fail(where() + " lies beyond the end of the file (truncated?)");
            if (!fletcher32Matches(scratch.data(), chunkBytes, scratch.data() + chunkBytes))
                fail(where() + " does not match its Fletcher32 checksum: the file is corrupt");
            for (std::size_t k = i; k < end; ++k)
                std::memcpy(m_out + k * c.rowBytes, scratch.data() + (std::uint64_t(m_rows[k]) - firstRow) * c.rowBytes,
                            c.rowBytes);
        }
        i = end;
    }
    if (!batch.flush(problem))
        fail(problem);
}

}  // namespace kvscope
