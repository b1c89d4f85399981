#pragma once
// One chunk of a results file's float arrays, encoded as HDF5's filter pipeline would (byte
// shuffle, deflate level 1, Fletcher32 appended: Hdf5File::createCompressedFloats) but
// outside libhdf5 and its lock, so that the analysis's bundle reads never wait on compression,
// which costs more than anything else the writer does. Written with Hdf5File::writeChunk;
// libhdf5 (and h5py) read it back as any chunk of that pipeline.

#include <cstddef>
#include <vector>

namespace kvscope {

std::vector<unsigned char> compressedChunk(const float* values, std::size_t count);

}  // namespace kvscope
