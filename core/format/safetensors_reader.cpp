#include "format/safetensors_reader.h"

#include "format/bundle_error.h"

#include <nlohmann/json.hpp>

#include <cstring>
#include <fstream>
#include <optional>

namespace kvscope {

namespace {

constexpr std::uint64_t kMaxHeader = 100u << 20;

std::optional<DType> floatDType(const std::string& name)
{
    if (name == "BF16")
        return DType::BFloat16;
    if (name == "F16")
        return DType::Float16;
    if (name == "F32")
        return DType::Float32;
    if (name == "F8_E4M3")
        return DType::Float8E4M3;
    if (name == "F8_E5M2")
        return DType::Float8E5M2;
    return std::nullopt;
}

std::uint64_t dtypeBytes(const std::string& name)
{
    static const std::map<std::string, std::uint64_t> sizes{
        {"BF16", 2}, {"F16", 2}, {"F32", 4}, {"F64", 8}, {"F8_E4M3", 1}, {"F8_E5M2", 1}, {"I64", 8}, {"I32", 4},
        {"I16", 2},  {"I8", 1},  {"U8", 1},  {"U16", 2}, {"U32", 4},     {"U64", 8},     {"BOOL", 1}};
    const auto it = sizes.find(name);
    return it == sizes.end() ? 0 : it->second;
}

}  // namespace

SafetensorsFile::SafetensorsFile(const std::string& path)
    : m_path(path)
{
    std::ifstream in(path, std::ios::binary | std::ios::ate);
    if (!in)
        throw BundleError(path, {}, std::string("cannot open: ") + std::strerror(errno));
    const std::uint64_t fileSize = std::uint64_t(in.tellg());
    in.seekg(0);
    unsigned char lengthBytes[8];
    if (fileSize < 8 || !in.read(reinterpret_cast<char*>(lengthBytes), 8))
        throw BundleError(path, "header", "file too short for a safetensors header");
    std::uint64_t headerLen = 0;
    for (int i = 7; i >= 0; --i)
        headerLen = (headerLen << 8) | lengthBytes[i];
    if (headerLen > kMaxHeader || headerLen > fileSize - 8)
        throw BundleError(path, "header", "declares a header of " + std::to_string(headerLen) + " bytes in a file of " +
                                              std::to_string(fileSize) + ": not safetensors, or truncated");
    std::string header(headerLen, '\0');
    in.read(header.data(), std::streamsize(headerLen));
    m_dataStart = 8 + headerLen;
    nlohmann::json root;
    try {
        root = nlohmann::json::parse(header);
    } catch (const nlohmann::json::exception& e) {  // parse errors, and numbers out of range (1e999)
        throw BundleError(path, "header", std::string("not valid JSON: ") + e.what());
    }
    if (!root.is_object())
        throw BundleError(path, "header", "must be a JSON object");
    for (const auto& [name, entry] : root.items()) {
        if (name == "__metadata__")
            continue;
        SafetensorsEntry e;
        try {
            e.dtype = entry.at("dtype").get<std::string>();
            e.shape = entry.at("shape").get<std::vector<std::int64_t>>();
            const auto offsets = entry.at("data_offsets").get<std::vector<std::uint64_t>>();
            if (offsets.size() != 2)
                throw BundleError(path, "tensor '" + name + "'", "data_offsets must hold two numbers");
            e.begin = offsets[0];
            e.end = offsets[1];
        } catch (const nlohmann::json::exception& ex) {
            throw BundleError(path, "tensor '" + name + "'", std::string("malformed header entry: ") + ex.what());
        }
        const std::uint64_t itemBytes = dtypeBytes(e.dtype);
        if (!itemBytes)
            throw BundleError(path, "tensor '" + name + "'", "unknown dtype '" + e.dtype + "'");
        std::uint64_t numel = 1;
        for (std::int64_t d : e.shape) {
            if (d < 0 || (d > 0 && numel > (std::uint64_t(1) << 40) / std::uint64_t(d)))
                throw BundleError(path, "tensor '" + name + "'", "absurd shape " + shapeToString(e.shape));
            numel *= std::uint64_t(d);
        }
        if (e.end < e.begin || e.end - e.begin != numel * itemBytes)
            throw BundleError(path, "tensor '" + name + "'", "data_offsets [" + std::to_string(e.begin) + ", " +
                                                             std::to_string(e.end) + ") do not fit shape " +
                                                             shapeToString(e.shape) + " of " + e.dtype);
        if (e.end > fileSize - m_dataStart)
            throw BundleError(path, "tensor '" + name + "'", "data runs past the end of the file (truncated?)");
        m_entries.emplace(name, e);
    }
}

RawTensor SafetensorsFile::tensor(const std::string& name) const
{
    const auto it = m_entries.find(name);
    if (it == m_entries.end())
        throw BundleError(m_path, "tensor '" + name + "'", "missing");
    const SafetensorsEntry& e = it->second;
    const auto dtype = floatDType(e.dtype);
    if (!dtype)
        throw BundleError(m_path, "tensor '" + name + "'", "dtype " + e.dtype + " is not a KV/logits dtype "
                                                                                  "(BF16, F16, F32, F8_E4M3, F8_E5M2)");
    RawTensor t;
    t.dtype = *dtype;
    t.shape = e.shape;
    t.bytes.resize(e.end - e.begin);
    std::ifstream in(m_path, std::ios::binary);
    in.seekg(std::streamoff(m_dataStart + e.begin));
    if (!in.read(reinterpret_cast<char*>(t.bytes.data()), std::streamsize(t.bytes.size())))
        throw BundleError(m_path, "tensor '" + name + "'", "cannot be read (truncated?)");
    return t;
}

}  // namespace kvscope
