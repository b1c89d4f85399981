#include "util/spillable_array.h"

#include <fcntl.h>
#include <linux/magic.h>
#include <sys/mman.h>
#include <sys/statfs.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <stdexcept>
#include <utility>

namespace kvscope {

namespace {

// Every in-memory array's bytes, process-wide: the results budget is the process's.
std::atomic<std::size_t> g_bytesInMemory{0};

std::size_t pageSize()
{
    static const std::size_t size = std::size_t(::sysconf(_SC_PAGESIZE));
    return size;
}

bool onTmpfs(const std::string& directory)
{
    struct statfs fs {};
    return ::statfs(directory.c_str(), &fs) == 0 && fs.f_type == TMPFS_MAGIC;
}

// An unlinked file of `bytes` in `directory`, its blocks reserved, mapped shared.
void* mapTemporaryFile(const std::string& directory, std::size_t bytes)
{
    auto fail = [&](const char* what, int error) {
        throw std::runtime_error("cannot keep analysis results in a temporary file in " + directory + ": " + what + ": " +
                                 std::strerror(error) + " (set TMPDIR to a folder with room)");
    };
    int fd = ::open(directory.c_str(), O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
    if (fd < 0 && (errno == EOPNOTSUPP || errno == EISDIR || errno == EINVAL)) {  // no O_TMPFILE here
        std::string name = directory + "/kvscope-results-XXXXXX";
        fd = ::mkostemp(name.data(), O_CLOEXEC);
        if (fd >= 0)
            ::unlink(name.c_str());
    }
    if (fd < 0)
        fail("creating it", errno);
    if (const int error = ::posix_fallocate(fd, 0, off_t(bytes)); error != 0) {
        ::close(fd);
        fail("reserving its space", error);
    }
    void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    const int error = errno;
    ::close(fd);  // the mapping keeps the file
    if (p == MAP_FAILED)
        fail("mapping it", error);
    return p;
}

}  // namespace

std::string defaultSpillDirectory()
{
    std::error_code ignored;
    std::string directory = std::filesystem::temp_directory_path(ignored).string();
    if (directory.empty())
        directory = "/tmp";
    return onTmpfs(directory) ? std::string("/var/tmp") : directory;
}

SpillableArray::SpillableArray(const SpillableArray& other)
{
    *this = other;
}

SpillableArray& SpillableArray::operator=(const SpillableArray& other)
{
    if (this == &other)
        return *this;
    assign(other.m_size, 0.0f, other.m_spillDirectory);
    constexpr std::size_t kStep = std::size_t(4) << 20;  // values: a spilled copy stays within what is in use
    for (std::size_t i = 0; i < m_size; i += kStep) {
        const std::size_t n = std::min(kStep, m_size - i);
        std::copy_n(other.m_data + i, n, m_data + i);
        other.release(i, n);
        release(i, n);
    }
    return *this;
}

SpillableArray::SpillableArray(SpillableArray&& other) noexcept
{
    *this = std::move(other);
}

SpillableArray& SpillableArray::operator=(SpillableArray&& other) noexcept
{
    if (this == &other)
        return *this;
    unmap();
    g_bytesInMemory -= std::exchange(m_countedBytes, std::exchange(other.m_countedBytes, 0));
    m_memory = std::move(other.m_memory);
    m_mapped = std::exchange(other.m_mapped, nullptr);
    m_mappedBytes = std::exchange(other.m_mappedBytes, 0);
    m_spillDirectory = std::move(other.m_spillDirectory);
    m_data = std::exchange(other.m_data, nullptr);
    m_size = std::exchange(other.m_size, 0);
    return *this;
}

SpillableArray::~SpillableArray()
{
    unmap();
    g_bytesInMemory -= m_countedBytes;
}

std::size_t SpillableArray::bytesInMemory()
{
    return g_bytesInMemory;
}

void SpillableArray::unmap()
{
    if (m_mapped)
        ::munmap(m_mapped, m_mappedBytes);
    m_mapped = nullptr;
    m_mappedBytes = 0;
}

void SpillableArray::clear()
{
    unmap();
    g_bytesInMemory -= std::exchange(m_countedBytes, 0);
    m_memory = {};
    m_spillDirectory.clear();
    m_data = nullptr;
    m_size = 0;
}

void SpillableArray::assign(std::size_t n, float fill, const std::string& spillDirectory)
{
    clear();
    if (n == 0)
        return;
    if (spillDirectory.empty()) {
        m_memory.assign(n, fill);
        m_data = m_memory.data();
        m_size = n;
        m_countedBytes = n * sizeof(float);
        g_bytesInMemory += m_countedBytes;
        return;
    }
    const std::size_t bytes = (n * sizeof(float) + pageSize() - 1) / pageSize() * pageSize();
    m_mapped = mapTemporaryFile(spillDirectory, bytes);
    m_mappedBytes = bytes;
    m_spillDirectory = spillDirectory;
    m_data = static_cast<float*>(m_mapped);
    m_size = n;
    constexpr std::size_t kStep = std::size_t(4) << 20;  // values filled, then given back, at a time
    for (std::size_t i = 0; i < n; i += kStep) {
        const std::size_t count = std::min(kStep, n - i);
        std::fill_n(m_data + i, count, fill);
        release(i, count);
    }
}

void SpillableArray::release(std::size_t first, std::size_t count) const
{
    if (!m_mapped || count == 0)
        return;
    const std::size_t page = pageSize();
    const auto base = reinterpret_cast<std::uintptr_t>(m_mapped);
    const std::uintptr_t from = (reinterpret_cast<std::uintptr_t>(m_data + first) + page - 1) / page * page;
    const std::uintptr_t to = std::min<std::uintptr_t>(reinterpret_cast<std::uintptr_t>(m_data + first + count) / page * page,
                                                       base + m_mappedBytes);
    // The last page holds the array's end and the file's tail: whole, it goes too.
    const std::uintptr_t end = first + count == m_size ? base + m_mappedBytes : to;
    if (end > from)
        ::madvise(reinterpret_cast<void*>(from), end - from, MADV_DONTNEED);
}

}  // namespace kvscope
