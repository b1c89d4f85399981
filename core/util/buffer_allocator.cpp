#include "util/buffer_allocator.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstdint>
#include <mutex>
#include <new>
#include <vector>

namespace kvscope {

namespace {

// Freed buffers kept for reuse, newest last; their total stays within kKeptBytes.
constexpr std::size_t kKeptBytes = std::size_t(256) << 20;

struct KeptBuffers {
    std::mutex mutex;
    std::vector<std::pair<void*, std::size_t>> buffers;
    std::size_t bytes = 0;
};

KeptBuffers& kept()
{
    static KeptBuffers* buffers = new KeptBuffers;  // never destroyed: buffers may be freed during exit
    return *buffers;
}

std::size_t mappedSize(std::size_t bytes)
{
    return (bytes + kLargeBuffer - 1) / kLargeBuffer * kLargeBuffer;
}

}  // namespace

void* allocateLargeBuffer(std::size_t bytes)
{
    const std::size_t size = mappedSize(bytes);
    {
        KeptBuffers& k = kept();
        std::lock_guard lock(k.mutex);
        const auto it = std::find_if(k.buffers.rbegin(), k.buffers.rend(), [&](const auto& b) { return b.second == size; });
        if (it != k.buffers.rend()) {
            void* buffer = it->first;
            k.bytes -= size;
            k.buffers.erase(std::next(it).base());
            return buffer;
        }
    }
    // Over-map by one huge page and trim, for an aligned start.
    void* p = ::mmap(nullptr, size + kLargeBuffer, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
        throw std::bad_alloc();
    const auto start = reinterpret_cast<std::uintptr_t>(p);
    const std::uintptr_t aligned = (start + kLargeBuffer - 1) / kLargeBuffer * kLargeBuffer;
    if (aligned > start)
        ::munmap(p, aligned - start);
    if (const std::uintptr_t end = start + size + kLargeBuffer; end > aligned + size)
        ::munmap(reinterpret_cast<void*>(aligned + size), end - aligned - size);
    ::madvise(reinterpret_cast<void*>(aligned), size, MADV_HUGEPAGE);
    return reinterpret_cast<void*>(aligned);
}

void freeLargeBuffer(void* buffer, std::size_t bytes)
{
    const std::size_t size = mappedSize(bytes);
    std::vector<std::pair<void*, std::size_t>> released;
    {
        KeptBuffers& k = kept();
        std::lock_guard lock(k.mutex);
        k.buffers.emplace_back(buffer, size);
        k.bytes += size;
        while (k.bytes > kKeptBytes) {  // the oldest go back to the kernel
            released.push_back(k.buffers.front());
            k.bytes -= k.buffers.front().second;
            k.buffers.erase(k.buffers.begin());
        }
    }
    for (const auto& [p, n] : released)
        ::munmap(p, n);
}

std::size_t keptBufferBytes()
{
    KeptBuffers& k = kept();
    std::lock_guard lock(k.mutex);
    return k.bytes;
}

void releaseKeptBuffers()
{
    std::vector<std::pair<void*, std::size_t>> released;
    {
        KeptBuffers& k = kept();
        std::lock_guard lock(k.mutex);
        released.swap(k.buffers);
        k.bytes = 0;
    }
    for (const auto& [p, n] : released)
        ::munmap(p, n);
}

}  // namespace kvscope
