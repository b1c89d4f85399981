#pragma once
// Strict reading of the JSON documents kvscope writes (an analysis, a results file's record,
// a bundle's outline): every field is checked, and a wrong one is a BundleError naming the
// file and the field (`where` is the path so far, "prompts[0]." or "").

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace kvscope {

class JsonFields {
public:
    using Json = nlohmann::ordered_json;  // keys in written order (a hypothesis's parameters)
    explicit JsonFields(std::string file) : m_file(std::move(file)) {}
    const std::string& file() const { return m_file; }

    const Json& at(const Json& object, const char* key, const std::string& where) const;
    std::int64_t integer(const Json& object, const char* key, const std::string& where) const;
    double number(const Json& object, const char* key, const std::string& where) const;  // null: NaN
    bool boolean(const Json& object, const char* key, const std::string& where) const;
    std::string text(const Json& object, const char* key, const std::string& where) const;
    const Json& array(const Json& object, const char* key, const std::string& where) const;
    std::vector<std::int64_t> integers(const Json& object, const char* key, const std::string& where) const;
    std::vector<int> ints(const Json& object, const char* key, const std::string& where) const;
    std::vector<std::string> texts(const Json& object, const char* key, const std::string& where) const;
    std::vector<float> floats(const Json& object, const char* key, const std::string& where) const;  // null: NaN
    // 16 hex digits (util/content_hash.h's hexFingerprint); null: 0.
    std::uint64_t fingerprint(const Json& v, const std::string& where) const;
    // [layer][token] numbers or nulls (NaN), `layers` x `tokens`.
    std::vector<float> layerRows(const Json& v, std::size_t layers, std::int64_t tokens, const std::string& where) const;
    [[noreturn]] void fail(const std::string& object, const std::string& problem) const;

private:
    std::string m_file;
};

}  // namespace kvscope
