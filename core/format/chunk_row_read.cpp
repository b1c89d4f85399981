#include "format/chunk_row_read.h"

#include "format/batched_reads.h"
#include "format/bundle_error.h"
#include "format/fletcher32.h"

#include <unistd.h>

#include <cstring>

namespace kvscope {

PlainFile::~PlainFile()
{
    if (fd >= 0)
        ::close(fd);
}

std::vector<ChunkRun> chunkRuns(const std::vector<std::int64_t>& rows, std::uint64_t chunkRows)
{
    std::vector<ChunkRun> runs;
    for (std::size_t i = 0; i < rows.size(); ++i) {
        const std::uint64_t firstRow = std::uint64_t(rows[i]) / chunkRows * chunkRows;
        if (runs.empty() || runs.back().firstRow != firstRow)
            runs.push_back({firstRow, i, i});
        runs.back().end = i + 1;
    }
    return runs;
}

ChunkRowRead::ChunkRowRead(std::shared_ptr<const PlainFile> file, std::string path, std::string dataset,
                           RowChunking chunking, std::vector<std::int64_t> rows, unsigned char* out)
    : m_file(std::move(file))
    , m_path(std::move(path))
    , m_dataset(std::move(dataset))
    , m_chunking(chunking)
    , m_rows(std::move(rows))
    , m_chunks(chunkRuns(m_rows, m_chunking.chunkRows))
    , m_out(out)
{
}

void ChunkRowRead::run() const
{
    const RowChunking& c = m_chunking;
    const std::size_t chunkBytes = std::size_t(c.chunkRows) * c.rowBytes;
    const std::size_t storedBytes = chunkBytes + (c.checksummed ? 4 : 0);
    const auto where = [](std::uint64_t firstRow) { return "chunk at row " + std::to_string(firstRow); };

    // Every read first (all at once: batched_reads.h), then every checksum. Unchecksummed:
    // each run of consecutive wanted rows straight into place. Checksummed and wanted whole:
    // the chunk straight into place, its checksum beside. Part of a checksummed chunk (or an
    // edge chunk, padded to full size): all of it aside (the checksum covers all of it), the
    // wanted rows copied out after.
    std::vector<unsigned char> sums(m_chunks.size() * 4);
    std::vector<std::vector<unsigned char>> scratch(m_chunks.size());
    std::vector<std::uint64_t> readRow;  // per read: the chunk named when it fails
    BatchedReads reads;
    for (std::size_t k = 0; k < m_chunks.size(); ++k) {
        const ChunkRun& chunk = m_chunks[k];
        const off_t at = off_t(m_file->base + m_addresses.at(k));
        if (!c.checksummed) {
            for (std::size_t first = chunk.begin; first < chunk.end;) {
                std::size_t last = first;
                while (last + 1 < chunk.end && m_rows[last + 1] == m_rows[last] + 1)
                    ++last;
                reads.add(at + off_t((std::uint64_t(m_rows[first]) - chunk.firstRow) * c.rowBytes),
                          {{m_out + first * c.rowBytes, (last - first + 1) * c.rowBytes}});
                readRow.push_back(chunk.firstRow);
                first = last + 1;
            }
        } else if (chunk.end - chunk.begin == c.chunkRows && chunk.firstRow + c.chunkRows <= c.totalRows) {
            reads.add(at, {{m_out + chunk.begin * c.rowBytes, chunkBytes}, {sums.data() + 4 * k, 4}});
            readRow.push_back(chunk.firstRow);
        } else {
            scratch[k].resize(storedBytes);
            reads.add(at, {{scratch[k].data(), storedBytes}});
            readRow.push_back(chunk.firstRow);
        }
    }
    if (const long failed = reads.run(m_file->fd); failed >= 0)
        throw BundleError(m_path, m_dataset,
                          where(readRow[std::size_t(failed)]) + " lies beyond the end of the file (truncated?)");
    if (!c.checksummed)
        return;
    for (std::size_t k = 0; k < m_chunks.size(); ++k) {
        const ChunkRun& chunk = m_chunks[k];
        const bool aside = !scratch[k].empty();
        const unsigned char* data = aside ? scratch[k].data() : m_out + chunk.begin * c.rowBytes;
        if (!fletcher32Matches(data, chunkBytes, aside ? data + chunkBytes : sums.data() + 4 * k))
            throw BundleError(m_path, m_dataset,
                              where(chunk.firstRow) + " does not match its Fletcher32 checksum: the file is corrupt");
        if (aside)
            for (std::size_t i = chunk.begin; i < chunk.end; ++i)
                std::memcpy(m_out + i * c.rowBytes, data + (std::uint64_t(m_rows[i]) - chunk.firstRow) * c.rowBytes,
                            c.rowBytes);
    }
}

}  // namespace kvscope
