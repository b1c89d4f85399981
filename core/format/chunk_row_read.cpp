#include "format/chunk_row_read.h"

#include "format/batched_reads.h"
#include "format/bundle_error.h"
#include "format/fletcher32.h"

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
    const auto fail = [&](const std::string& what) { throw BundleError(m_path, m_dataset, what); };
    const auto where = [](std::uint64_t firstRow) { return "chunk at row " + std::to_string(firstRow); };

    // Every read first (all at once: batched_reads.h), then every checksum. A checksummed
    // chunk wanted whole lands straight in `m_out`, its checksum beside; adjacent ones share a
    // read. Part of a chunk (or an edge chunk, padded to full size) is read whole, aside (its
    // checksum covers all of it), and its rows copied out after.
    struct Chunk {
        std::uint64_t firstRow;
        unsigned char* data;        // in m_out, or the chunk's scratch
        std::size_t sum;            // index into sums
        std::size_t scratch;        // index into scratches, or npos
        std::size_t rowsBegin, rowsEnd;  // the wanted rows it holds: m_rows[rowsBegin, rowsEnd)
    };
    constexpr std::size_t npos = std::size_t(-1);
    std::vector<Chunk> checked;
    std::vector<unsigned char> sums;
    std::vector<std::vector<unsigned char>> scratches;
    std::vector<std::uint64_t> readRow;  // per read: the row named when it fails
    BatchedReads reads;
    std::vector<iovec> batch;  // adjacent whole chunks, not yet added
    off_t batchAt = 0, batchEnd = 0;
    std::uint64_t batchRow = 0;
    constexpr std::size_t kMaxBatchChunks = 256;  // two iovecs each, within IOV_MAX
    const auto addBatch = [&] {
        if (batch.empty())
            return;
        reads.add(batchAt, std::move(batch));
        readRow.push_back(batchRow);
        batch.clear();
    };

    // Checksums land in `sums`, whose buffer must not move once reads point into it.
    std::size_t checksummedChunks = 0;
    for (std::size_t i = 0; i < m_rows.size(); ++i)
        if (i == 0 || std::uint64_t(m_rows[i]) / c.chunkRows != std::uint64_t(m_rows[i - 1]) / c.chunkRows)
            ++checksummedChunks;
    sums.resize(c.checksummed ? checksummedChunks * 4 : 0);

    std::size_t chunkIndex = 0;
    for (std::size_t i = 0; i < m_rows.size(); ++chunkIndex) {
        const std::uint64_t firstRow = std::uint64_t(m_rows[i]) / c.chunkRows * c.chunkRows;
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
                reads.add(at + off_t((std::uint64_t(m_rows[first]) - firstRow) * c.rowBytes),
                          {{m_out + first * c.rowBytes, (last - first + 1) * c.rowBytes}});
                readRow.push_back(firstRow);
                first = last + 1;
            }
        } else if (end - i == c.chunkRows && firstRow + c.chunkRows <= c.totalRows) {
            if (!batch.empty() && (at != batchEnd || batch.size() >= 2 * kMaxBatchChunks))
                addBatch();
            if (batch.empty())
                batchAt = at, batchRow = firstRow;
            checked.push_back({firstRow, m_out + i * c.rowBytes, checked.size() * 4, npos, i, end});
            batch.push_back({checked.back().data, chunkBytes});
            batch.push_back({sums.data() + checked.back().sum, 4});
            batchEnd = at + off_t(storedBytes);
        } else {
            addBatch();
            scratches.emplace_back(storedBytes);
            checked.push_back({firstRow, scratches.back().data(), checked.size() * 4, scratches.size() - 1, i, end});
            reads.add(at, {{scratches.back().data(), storedBytes}});
            readRow.push_back(firstRow);
        }
        i = end;
    }
    addBatch();

    if (const long failed = reads.run(m_file->fd); failed >= 0)
        fail(where(readRow[std::size_t(failed)]) + " lies beyond the end of the file (truncated?)");
    for (const Chunk& chunk : checked) {
        const unsigned char* sum = chunk.scratch == npos ? sums.data() + chunk.sum : chunk.data + chunkBytes;
        if (!fletcher32Matches(chunk.data, chunkBytes, sum))
            fail(where(chunk.firstRow) + " does not match its Fletcher32 checksum: the file is corrupt");
        if (chunk.scratch != npos)
            for (std::size_t k = chunk.rowsBegin; k < chunk.rowsEnd; ++k)
                std::memcpy(m_out + k * c.rowBytes, chunk.data + (std::uint64_t(m_rows[k]) - chunk.firstRow) * c.rowBytes,
                            c.rowBytes);
    }
}

}  // namespace kvscope
