#pragma once
// libtorch 1.13's unpickler allocates whatever length a pickle opcode claims before it finds
// the bytes missing (a 4 GB string from a 1 KB file: fuzzing found it). kvscope walks the
// pickle's opcodes first and refuses a length that runs past the end of the pickle.

#include <cstddef>
#include <string>

namespace kvscope {

// `pickle`: the archive's data.pkl. Opcodes it does not know end the walk (libtorch judges
// those). Throws BundleError naming `path` and `entry`.
void checkPickleLengths(const char* pickle, std::size_t size, const std::string& path, const std::string& entry);

}  // namespace kvscope
