#pragma once
// The allocator of layer-sized buffers (tens of megabytes, allocated and freed per layer):
// - value-less construct() leaves trivial types uninitialised, so that resize() on a buffer
//   that is about to be overwritten costs no extra pass over memory;
// - buffers of 2 MiB and more are mapped on their own, 2 MiB-aligned and asked to live on
//   transparent huge pages (faulting such a buffer in 4 KiB at a time costs more than
//   filling it: measured, a third of the analysis on a virtual machine), and freed ones are
//   kept for the next buffer of the same size (the next layer's), up to a bound and until
//   releaseKeptBuffers(): layer after layer reuses memory already faulted in, and the heap
//   does not fragment.

#include <cstddef>
#include <memory>
#include <new>
#include <utility>

namespace kvscope {

inline constexpr std::size_t kLargeBuffer = std::size_t(2) << 20;
// At least `bytes` (>= kLargeBuffer); throws std::bad_alloc.
void* allocateLargeBuffer(std::size_t bytes);
void freeLargeBuffer(void* buffer, std::size_t bytes);
// Gives the kept buffers back to the kernel (when a long piece of work ends).
void releaseKeptBuffers();
// The bytes of freed buffers kept now.
std::size_t keptBufferBytes();

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

    T* allocate(std::size_t n)
    {
        if (n > std::size_t(-1) / sizeof(T))
            throw std::bad_array_new_length();
        if (n * sizeof(T) < kLargeBuffer)
            return std::allocator<T>::allocate(n);
        return static_cast<T*>(allocateLargeBuffer(n * sizeof(T)));
    }
    void deallocate(T* p, std::size_t n)
    {
        if (n * sizeof(T) < kLargeBuffer)
            std::allocator<T>::deallocate(p, n);
        else
            freeLargeBuffer(p, n * sizeof(T));
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
