#pragma once
// A torch.save file is a zip archive. libtorch 1.13's reader trusts the archive's offsets and
// lengths (fuzzing found it reading past its buffer on a damaged one), so kvscope checks the
// structure first: the end records, every central directory entry and its local header and
// data lie inside the file, and every entry is stored uncompressed (as torch.save writes them).

#include <cstdint>
#include <string>
#include <vector>

namespace kvscope {

struct ZipEntry {
    std::string name;
    std::uint64_t data = 0;  // where its bytes start in the archive
    std::uint64_t size = 0;
};

// A name as libtorch's zip reader (miniz) matches it: ASCII letters in lower case.
std::string matchingName(std::string name);

// The archive's entries, every one checked to lie inside the file. Throws BundleError naming
// `path` and what is wrong.
std::vector<ZipEntry> checkZipStructure(const std::vector<char>& bytes, const std::string& path);

}  // namespace kvscope
