#pragma once
// A torch.save file is a zip archive. libtorch 1.13's reader trusts the archive's offsets and
// lengths (fuzzing found it reading past its buffer on a damaged one), so kvscope checks the
// structure first: the end records, every central directory entry and its local header and
// data lie inside the file.

#include <string>
#include <vector>

namespace kvscope {

// Throws BundleError naming `path` and what is wrong.
void checkZipStructure(const std::vector<char>& bytes, const std::string& path);

}  // namespace kvscope
