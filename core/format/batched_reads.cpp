#include "format/batched_reads.h"

#include <liburing.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <string_view>

namespace kvscope {

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
        while (count > 0 && parts->iov_len == 0)
            ++parts, --count;
    }
    return true;
}

namespace {

constexpr unsigned kRingEntries = 256;

// One ring per thread, set up on first use; null where io_uring is unavailable or not wanted
// (or once it failed: the rest goes by preadv).
struct ThreadRing {
    io_uring ring{};
    bool ready = false;
    ThreadRing()
    {
        const char* forced = std::getenv("KVSCOPE_IO");
        if (forced && std::string_view(forced) == "pread")
            return;
        ready = io_uring_queue_init(kRingEntries, &ring, 0) == 0;
    }
    ~ThreadRing() { close(); }
    void close()
    {
        if (ready)
            io_uring_queue_exit(&ring);  // drops whatever was not submitted
        ready = false;
    }
};

ThreadRing& threadRing()
{
    thread_local ThreadRing ring;
    return ring;
}

}  // namespace

void BatchedReads::add(off_t at, std::vector<iovec> parts)
{
    m_reads.push_back({at, std::move(parts)});
}

long BatchedReads::run(int fd)
{
    long failed = -1;
    // Reads the rest of read `i` from `part` on by preadv, which tells a real end of file.
    auto readRest = [&](std::size_t i, std::size_t part, off_t at) {
        Read& r = m_reads[i];
        if (!preadFully(fd, r.parts.data() + part, int(r.parts.size() - part), at) && (failed < 0 || long(i) < failed))
            failed = long(i);
    };
    ThreadRing& ring = threadRing();
    std::vector<char> done(m_reads.size(), 0);
    for (std::size_t first = 0; first < m_reads.size() && ring.ready && m_reads.size() > 1; first += kRingEntries) {
        const std::size_t count = std::min<std::size_t>(kRingEntries, m_reads.size() - first);
        for (std::size_t i = first; i < first + count; ++i) {
            io_uring_sqe* sqe = io_uring_get_sqe(&ring.ring);  // never null: at most kRingEntries in flight
            io_uring_prep_readv(sqe, fd, m_reads[i].parts.data(), unsigned(m_reads[i].parts.size()), m_reads[i].at);
            io_uring_sqe_set_data64(sqe, i);
        }
        int submitted = io_uring_submit_and_wait(&ring.ring, unsigned(count));
        while (submitted == -EINTR)
            submitted = io_uring_submit_and_wait(&ring.ring, unsigned(count));
        for (int reaped = 0; reaped < submitted; ++reaped) {
            io_uring_cqe* cqe = nullptr;
            if (io_uring_wait_cqe(&ring.ring, &cqe) < 0)
                break;
            const std::size_t i = std::size_t(io_uring_cqe_get_data64(cqe));
            const int result = cqe->res;
            io_uring_cqe_seen(&ring.ring, cqe);
            done[i] = 1;
            Read& r = m_reads[i];
            std::size_t wanted = 0;
            for (const iovec& part : r.parts)
                wanted += part.iov_len;
            if (result == int(wanted))
                continue;
            // Short or failed (-EAGAIN...): the rest by preadv.
            std::size_t skip = result > 0 ? std::size_t(result) : 0;
            std::size_t k = 0;
            for (; k < r.parts.size() && skip >= r.parts[k].iov_len; ++k)
                skip -= r.parts[k].iov_len;
            if (k < r.parts.size()) {
                r.parts[k].iov_base = static_cast<char*>(r.parts[k].iov_base) + skip;
                r.parts[k].iov_len -= skip;
            }
            readRest(i, k, r.at + off_t(result > 0 ? result : 0));
        }
        if (submitted != int(count))
            ring.close();  // something is wrong with the ring: the rest (and later batches) by preadv
    }
    for (std::size_t i = 0; i < m_reads.size(); ++i)
        if (!done[i])
            readRest(i, 0, m_reads[i].at);
    m_reads.clear();
    return failed;
}

}  // namespace kvscope
