#include "results/compressed_chunk.h"

#include "format/fletcher32.h"
#include "format/hdf5_file.h"

#include <zlib.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <mutex>
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

void writeCompressedLayer(Hdf5File& file, const std::string& dataset, const float* layerValues, std::int64_t tokens,
                          std::int64_t heads, std::int64_t chunkTokens, int layer)
{
    chunkTokens = std::clamp<std::int64_t>(chunkTokens, 1, std::max<std::int64_t>(1, tokens));
    const std::int64_t width = std::max<std::int64_t>(1, heads);
    std::vector<std::pair<std::int64_t, std::vector<unsigned char>>> chunks;
    std::vector<float> padded(std::size_t(chunkTokens * width));
    for (std::int64_t first = 0; first < tokens; first += chunkTokens) {
        const std::int64_t n = std::min(chunkTokens, tokens - first);
        std::copy_n(layerValues + first * width, n * width, padded.begin());
        std::fill(padded.begin() + std::ptrdiff_t(n * width), padded.end(), std::numeric_limits<float>::quiet_NaN());
        chunks.emplace_back(first, compressedChunk(padded.data(), padded.size()));
    }
    const std::lock_guard lock(hdf5Mutex());
    for (const auto& [first, bytes] : chunks)
        file.writeChunk(dataset, heads > 0 ? std::vector<std::int64_t>{layer, first, 0} : std::vector<std::int64_t>{layer, first},
                        bytes);
}

}  // namespace kvscope
