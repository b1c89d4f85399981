#pragma once
// Where a command writes: checked before any work, so that a long analysis does not fail at its
// end, and never onto one of the files it reads (kvscope analyze X.kvres --save X.kvres).

#include <string>
#include <vector>

namespace kvscope {

// Throws BundleError naming `output` when it is a folder, when its folder does not exist or
// cannot be written, or when it is the same file as one of `inputs`.
void requireWritableOutput(const std::string& output, const std::vector<std::string>& inputs);

}  // namespace kvscope
