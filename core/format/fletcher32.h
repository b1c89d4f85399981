#pragma once
// HDF5's Fletcher-32 checksum (the H5Z_FILTER_FLETCHER32 filter), bit for bit: the reader
// verifies the chunks it reads straight from the file itself, without HDF5's copy.

#include <cstddef>
#include <cstdint>

namespace kvscope {

// The checksum HDF5 computes over `bytes` (16-bit big-endian words, odd tail byte shifted).
std::uint32_t fletcher32(const unsigned char* data, std::size_t bytes);

// The same checksum over data that comes in pieces, in order: add() each (all of even length),
// then finish() (with the whole's last byte when its length is odd).
class Fletcher32Sum {
public:
    void add(const unsigned char* data, std::size_t bytes);
    std::uint32_t finish(const unsigned char* oddByte = nullptr);

private:
    std::uint32_t m_sum1 = 0;
    std::uint32_t m_sum2 = 0;
    std::uint32_t m_inRun = 0;  // words since the sums were last folded
};

// The checksum the filter stored after a chunk's data (4 bytes, little-endian).
std::uint32_t storedFletcher32(const unsigned char* stored);

// Whether a chunk's data matches the 4 bytes the filter stored after it (little-endian).
// (HDF5 also accepts a byte-swapped sum written by versions before 1.6.3; no bundle is that old.)
bool fletcher32Matches(const unsigned char* data, std::size_t bytes, const unsigned char* stored);

}  // namespace kvscope
