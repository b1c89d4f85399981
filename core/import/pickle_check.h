#pragma once
// libtorch 1.13's unpickler trusts the pickle (fuzzing found both): it allocates whatever
// length an opcode claims (a 4 GB string from a 1 KB file), and it gives a tensor storage the
// size the pickle declares whatever the size of its record in the archive, so reading the
// tensor runs past the buffer. kvscope walks the pickle's opcodes first: no length may run
// past the pickle's end, and every storage (torch.save's persistent id ('storage', type, key,
// location, numel)) must fit in its record.

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>

namespace kvscope {

// `pickle`: the archive's data.pkl; `records`: the archive's entries by matchingName (libtorch's
// zip reader ignores case) and their sizes, `prefix` the folder they sit in ("archive/", as
// matchingName). Opcodes it does not know end the walk (libtorch
// judges those). Throws BundleError naming `path` and `entry`.
void checkPickle(const char* pickle, std::size_t size, const std::map<std::string, std::uint64_t>& records,
                 const std::string& prefix, const std::string& path, const std::string& entry);

}  // namespace kvscope
