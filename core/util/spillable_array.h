#pragma once
// A float array that lives in memory or, when an analysis's results are too large to hold
// (every metric of every cell: about 4 GB at 80 layers x 128k tokens x 8 heads), in a temporary
// file mapped into memory. A spilled array's pages go back to the file whenever release() says a
// range is done with, so what stays resident is what is being written or read, whatever the
// array's size; reading a released range again brings it back from the file (the page cache,
// usually). The file is unlinked as soon as it is created, and its space reserved up front: a
// full disk is an error when the array is made, not a crash when a page is first written.

#include "util/buffer_allocator.h"

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

namespace kvscope {

// Where spilled arrays go: $TMPDIR (or /tmp), unless that is a tmpfs (memory itself), then /var/tmp.
std::string defaultSpillDirectory();

class SpillableArray {
public:
    SpillableArray() = default;
    SpillableArray(const SpillableArray& other);
    SpillableArray& operator=(const SpillableArray& other);
    SpillableArray(SpillableArray&& other) noexcept;
    SpillableArray& operator=(SpillableArray&& other) noexcept;
    ~SpillableArray();

    // `n` values, each `fill`: in memory when `spillDirectory` is empty, else in a temporary
    // file there. Throws std::runtime_error naming the directory when the file cannot be made.
    void assign(std::size_t n, float fill, const std::string& spillDirectory = {});
    void clear();

    bool spilled() const { return m_mapped != nullptr; }
    // The bytes of every array of the process held in memory (not spilled), now.
    static std::size_t bytesInMemory();
    // Gives the resident pages wholly inside [first, first + count) back to the file (spilled
    // arrays; nothing otherwise). The values stay: this only says they are not needed now.
    void release(std::size_t first, std::size_t count) const;

    std::size_t size() const { return m_size; }
    bool empty() const { return m_size == 0; }
    float* data() { return m_data; }
    const float* data() const { return m_data; }
    float& operator[](std::size_t i) { return m_data[i]; }
    float operator[](std::size_t i) const { return m_data[i]; }
    float* begin() { return m_data; }
    float* end() { return m_data + m_size; }
    const float* begin() const { return m_data; }
    const float* end() const { return m_data + m_size; }

private:
    void unmap();

    std::vector<float, BufferAllocator<float>> m_memory;
    void* m_mapped = nullptr;  // the whole mapping, when spilled
    std::size_t m_mappedBytes = 0;
    std::string m_spillDirectory;  // for copies
    float* m_data = nullptr;
    std::size_t m_size = 0;
    std::size_t m_countedBytes = 0;  // this array's share of bytesInMemory()
};

}  // namespace kvscope
