#pragma once
// What a torch.save file holds, read with libtorch and handed over without any torch type:
// nested dicts, lists and tuples of tensors, numbers and strings.

#include "format/raw_tensor.h"

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace kvscope {

struct PtEntry;

struct PtValue {
    enum class Kind { None, Bool, Int, Double, String, FloatTensor, IntTensor, List, Dict };
    Kind kind = Kind::None;
    bool boolean = false;
    std::int64_t integer = 0;
    double number = 0;
    std::string text;
    RawTensor tensor;                        // FloatTensor: in its own dtype
    std::vector<std::int64_t> intValues;     // IntTensor: values as int64 ...
    std::vector<std::int64_t> shape;         // ... and their shape
    std::vector<PtValue> items;              // List (lists and tuples)
    std::vector<PtEntry> entries;            // Dict, keys as text

    const PtValue* find(const std::string& key) const;
    std::string kindName() const;
};

struct PtEntry {
    std::string key;
    PtValue value;
};

inline const PtValue* PtValue::find(const std::string& key) const
{
    for (const auto& [k, v] : entries)
        if (k == key)
            return &v;
    return nullptr;
}

// Reads a file written by Python's torch.save (zip format, pickle protocol 2). The known
// limits of libtorch 1.13's reader become BundleErrors naming the file and the workaround.
PtValue loadPtFile(const std::string& path);

}  // namespace kvscope
