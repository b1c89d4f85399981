#pragma once
// One chunk of a results file's float arrays, encoded as HDF5's filter pipeline would (byte
// shuffle, deflate level 1, Fletcher32 appended: Hdf5File::createCompressedFloats) but
// outside libhdf5 and its lock, so that the analysis's bundle reads never wait on compression,
// which costs more than anything else the writer does. Written with Hdf5File::writeChunk;
// libhdf5 (and h5py) read it back as any chunk of that pipeline.

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace kvscope {

class Hdf5File;

std::vector<unsigned char> compressedChunk(const float* values, std::size_t count);

// One layer of a [layer][token][width] dataset made by createCompressedFloats with chunks of
// {1, chunkTokens, width} (clipped to the shape), chunk by chunk, the last padded with NaN (the
// dataset's fill value): compressed without the HDF5 lock, stored with it. `heads` 0: a
// [layer][token] dataset.
void writeCompressedLayer(Hdf5File& file, const std::string& dataset, const float* layerValues, std::int64_t tokens,
                          std::int64_t heads, std::int64_t chunkTokens, int layer);

}  // namespace kvscope
