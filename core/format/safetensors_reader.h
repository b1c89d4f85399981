#pragma once
// Reads .safetensors files directly (an 8-byte little-endian header length, a JSON header,
// then raw little-endian data): what HF `save_file` writes for past_key_values or logits.

#include "format/raw_tensor.h"

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace kvscope {

struct SafetensorsEntry {
    std::string dtype;  // as written: "BF16", "F16", "F32", "F8_E4M3", "F8_E5M2", "I64", ...
    std::vector<std::int64_t> shape;
    std::uint64_t begin = 0;  // byte offsets into the data section
    std::uint64_t end = 0;
};

class SafetensorsFile {
public:
    // Reads and checks the header (sizes, offsets within the file); throws BundleError naming the file.
    explicit SafetensorsFile(const std::string& path);

    const std::string& path() const { return m_path; }
    const std::map<std::string, SafetensorsEntry>& entries() const { return m_entries; }
    bool contains(const std::string& name) const { return m_entries.count(name) != 0; }
    // A floating-point tensor in its own dtype (BF16, F16, F32, F8_E4M3, F8_E5M2).
    RawTensor tensor(const std::string& name) const;

private:
    std::string m_path;
    std::uint64_t m_dataStart = 0;
    std::map<std::string, SafetensorsEntry> m_entries;
};

}  // namespace kvscope
