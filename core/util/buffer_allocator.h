#pragma once
// The allocator of layer-sized buffers (tens of megabytes, allocated and freed per layer):
// - value-less construct() leaves trivial types uninitialised, so that resize() on a buffer
//   that is about to be overwritten costs no extra pass over memory;
// - buffers of 2 MiB and more are aligned to 2 MiB and asked to live on transparent huge
//   pages: faulting such a buffer in 4 KiB at a time costs more than filling it (measured:
//   a third of the analysis on a virtual machine). Without THP (or with it off), plain pages.

#include <sys/mman.h>

#include <cstdlib>
#include <memory>
#include <new>
#include <utility>

namespace kvscope {

template <typename T>
struct BufferAllocator : std::allocator<T> {
    template <typename U>
    struct rebind {
        using other = BufferAllocator<U>;
    };
    BufferAllocator() = default;
    template <typename U>
    BufferAllocator(const BufferAllocator<U>&) noexcept
    {
    }

    static constexpr std::size_t kHugePage = std::size_t(2) << 20;

    T* allocate(std::size_t n)
    {
        if (n > std::size_t(-1) / sizeof(T))
            throw std::bad_array_new_length();
        const std::size_t bytes = n * sizeof(T);
        if (bytes < kHugePage)
            return std::allocator<T>::allocate(n);
        const std::size_t rounded = (bytes + kHugePage - 1) / kHugePage * kHugePage;
        void* p = std::aligned_alloc(kHugePage, rounded);
        if (!p)
            throw std::bad_alloc();
        ::madvise(p, rounded, MADV_HUGEPAGE);
        return static_cast<T*>(p);
    }
    void deallocate(T* p, std::size_t n)
    {
        if (n * sizeof(T) < kHugePage)
            std::allocator<T>::deallocate(p, n);
        else
            std::free(p);
    }

    template <typename U, typename... Args>
    void construct(U* p, Args&&... args)
    {
        if constexpr (sizeof...(Args) == 0)
            ::new (static_cast<void*>(p)) U;
        else
            ::new (static_cast<void*>(p)) U(std::forward<Args>(args)...);
    }
};

template <typename T, typename U>
bool operator==(const BufferAllocator<T>&, const BufferAllocator<U>&)
{
    return true;
}

}  // namespace kvscope
