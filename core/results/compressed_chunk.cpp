#include "results/compressed_chunk.h"

#include "format/fletcher32.h"

#include <zlib.h>

#include <cstring>
#include <stdexcept>

namespace kvscope {

std::vector<unsigned char> compressedChunk(const float* values, std::size_t count)
{
    // H5Z_FILTER_SHUFFLE: byte k of every element together, k = 0..3.
    const std::size_t bytes = count * sizeof(float);
    std::vector<unsigned char> shuffled(bytes);
    const auto* in = reinterpret_cast<const unsigned char*>(values);
    for (std::size_t k = 0; k < sizeof(float); ++k)
        for (std::size_t i = 0; i < count; ++i)
            shuffled[k * count + i] = in[i * sizeof(float) + k];
    // H5Z_FILTER_DEFLATE: zlib's compress2 at the level the dataset names.
    uLongf compressed = compressBound(uLong(bytes));
    std::vector<unsigned char> out(compressed + 4);
    if (compress2(out.data(), &compressed, shuffled.data(), uLong(bytes), 1) != Z_OK)
        throw std::runtime_error("deflate failed on a results chunk");
    // H5Z_FILTER_FLETCHER32: the sum of the stored bytes after them, little-endian.
    const std::uint32_t sum = fletcher32(out.data(), compressed);
    for (int b = 0; b < 4; ++b)
        out[compressed + std::size_t(b)] = static_cast<unsigned char>(sum >> (8 * b));
    out.resize(compressed + 4);
    return out;
}

}  // namespace kvscope
