#include "format/json_fields.h"

#include "format/bundle_error.h"

#include <cmath>

namespace kvscope {

const JsonFields::Json& JsonFields::at(const Json& object, const char* key, const std::string& where) const
{
    if (!object.is_object() || !object.contains(key))
        fail(where + key, "missing");
    return object[key];
}

std::int64_t JsonFields::integer(const Json& object, const char* key, const std::string& where) const
{
    const Json& v = at(object, key, where);
    if (!v.is_number_integer())
        fail(where + key, "must be an integer");
    return v.get<std::int64_t>();
}

double JsonFields::number(const Json& object, const char* key, const std::string& where) const
{
    const Json& v = at(object, key, where);
    if (v.is_null())
        return std::nan("");
    if (!v.is_number())
        fail(where + key, "must be a number or null");
    return v.get<double>();
}

bool JsonFields::boolean(const Json& object, const char* key, const std::string& where) const
{
    const Json& v = at(object, key, where);
    if (!v.is_boolean())
        fail(where + key, "must be true or false");
    return v.get<bool>();
}

std::string JsonFields::text(const Json& object, const char* key, const std::string& where) const
{
    const Json& v = at(object, key, where);
    if (!v.is_string())
        fail(where + key, "must be a string");
    return v.get<std::string>();
}

const JsonFields::Json& JsonFields::array(const Json& object, const char* key, const std::string& where) const
{
    const Json& v = at(object, key, where);
    if (!v.is_array())
        fail(where + key, "must be an array");
    return v;
}

std::vector<std::int64_t> JsonFields::integers(const Json& object, const char* key, const std::string& where) const
{
    std::vector<std::int64_t> out;
    for (const Json& x : array(object, key, where)) {
        if (!x.is_number_integer())
            fail(where + key, "must hold integers");
        out.push_back(x.get<std::int64_t>());
    }
    return out;
}

std::vector<int> JsonFields::ints(const Json& object, const char* key, const std::string& where) const
{
    std::vector<int> out;
    for (std::int64_t x : integers(object, key, where)) {
        if (x < INT32_MIN || x > INT32_MAX)
            fail(where + key, "holds " + std::to_string(x) + ", outside a 32-bit integer");
        out.push_back(int(x));
    }
    return out;
}

std::vector<std::string> JsonFields::texts(const Json& object, const char* key, const std::string& where) const
{
    std::vector<std::string> out;
    for (const Json& x : array(object, key, where)) {
        if (!x.is_string())
            fail(where + key, "must hold strings");
        out.push_back(x.get<std::string>());
    }
    return out;
}

std::vector<float> JsonFields::floats(const Json& object, const char* key, const std::string& where) const
{
    std::vector<float> out;
    for (const Json& x : array(object, key, where)) {
        if (!x.is_null() && !x.is_number())
            fail(where + key, "holds something that is neither a number nor null");
        out.push_back(x.is_null() ? std::nanf("") : x.get<float>());
    }
    return out;
}

std::uint64_t JsonFields::fingerprint(const Json& v, const std::string& where) const
{
    if (v.is_null())
        return 0;
    const std::string text = v.is_string() ? v.get<std::string>() : std::string();
    if (text.size() != 16 || text.find_first_not_of("0123456789abcdef") != std::string::npos)
        fail(where, "must be 16 hex digits");
    return std::stoull(text, nullptr, 16);
}

std::vector<float> JsonFields::layerRows(const Json& v, std::size_t layers, std::int64_t tokens,
                                         const std::string& where) const
{
    if (!v.is_array() || v.size() != layers)
        fail(where, "must hold " + std::to_string(layers) + " layers");
    std::vector<float> out;
    out.reserve(layers * std::size_t(tokens));
    for (std::size_t l = 0; l < layers; ++l) {
        const Json& row = v[l];
        if (!row.is_array() || row.size() != std::size_t(tokens))
            fail(where + "[" + std::to_string(l) + "]", "must hold " + std::to_string(tokens) + " tokens");
        for (const Json& x : row) {
            if (!x.is_null() && !x.is_number())
                fail(where + "[" + std::to_string(l) + "]", "holds something that is neither a number nor null");
            out.push_back(x.is_null() ? std::nanf("") : x.get<float>());
        }
    }
    return out;
}

void JsonFields::fail(const std::string& object, const std::string& problem) const
{
    throw BundleError(m_file, object, problem);
}

}  // namespace kvscope
