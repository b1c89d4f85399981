#pragma once
// Many reads of one file at once (the runs of wanted rows in v1 bundles' shared chunks, which
// lie scattered: one system call per 4 KiB costs more than copying it). Where the kernel
// allows io_uring, every read goes in one submission; elsewhere (io_uring off, or a container
// that forbids it; KVSCOPE_IO=pread forces this) one preadv each.

#include <sys/types.h>
#include <sys/uio.h>

#include <cstddef>
#include <vector>

namespace kvscope {

class BatchedReads {
public:
    // One read of `parts` (their buffers must live until run() returns) at `at`.
    void add(off_t at, std::vector<iovec> parts);
    std::size_t size() const { return m_reads.size(); }
    // Reads everything; returns the index of the first read (in add order) that could not be
    // read whole (past the end of the file, an I/O error), or -1 when all were.
    long run(int fd);

private:
    struct Read {
        off_t at;
        std::vector<iovec> parts;
    };
    std::vector<Read> m_reads;
};

// Reads exactly the iovecs' bytes at `at` by preadv, or returns false (end of file, I/O
// error). `parts` is advanced past what was read.
bool preadFully(int fd, iovec* parts, int count, off_t at);

}  // namespace kvscope
