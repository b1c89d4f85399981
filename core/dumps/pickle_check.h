#pragma once
// libtorch 1.13's unpickler trusts the pickle (fuzzing and a review found it): it allocates
// whatever length an opcode claims, pops an empty stack, reads a line past the pickle's end,
// sizes its memo table by any index, and gives a tensor storage the size the pickle declares
// whatever the size of its record in the archive, so reading the tensor runs past the buffer.
// kvscope walks the pickle's opcodes first, modelling the unpickler's stack, marks and memo,
// and refuses anything libtorch could not read safely; every storage (torch.save's persistent
// id ('storage', type, key, 'cpu', numel)) must fit in its record. docs/import.md lists it all.

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>

namespace kvscope {

// `pickle`: the archive's data.pkl; `records`: the archive's entries by matchingName (libtorch's
// zip reader ignores case) and their sizes, `prefix` the folder they sit in ("archive/", as
// matchingName). An opcode no unpickler knows ends the walk (libtorch refuses it too). Throws
// BundleError naming `path` and `entry`.
void checkPickle(const char* pickle, std::size_t size, const std::map<std::string, std::uint64_t>& records,
                 const std::string& prefix, const std::string& path, const std::string& entry);

}  // namespace kvscope
