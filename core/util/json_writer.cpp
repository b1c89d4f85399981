#include "util/json_writer.h"

#include "util/utf8.h"

#include <nlohmann/json.hpp>

#include <cassert>
#include <charconv>
#include <cstring>
#include <cmath>
#include <cstdio>
#include <sstream>

namespace kvscope {

namespace {

void writeString(std::ostream& out, std::string_view text)
{
    out.put('"');
    const std::string_view bytes = text;
    for (std::size_t i = 0; i < bytes.size();) {
        const unsigned char c = static_cast<unsigned char>(bytes[i]);
        const std::size_t n = utf8SequenceLength(bytes, i);
        if (n == 0) {  // not UTF-8 (names come from files): the byte as the text \xNN
            out << "\\\\" << escapedByte(c).substr(1);
            ++i;
            continue;
        }
        if (n > 1) {
            out.write(bytes.data() + i, std::streamsize(n));
            i += n;
            continue;
        }
        ++i;
        switch (c) {
        case '"': out << "\\\""; break;
        case '\\': out << "\\\\"; break;
        case '\n': out << "\\n"; break;
        case '\r': out << "\\r"; break;
        case '\t': out << "\\t"; break;
        default:
            if (c < 0x20) {
                char buf[8];
                std::snprintf(buf, sizeof buf, "\\u%04x", c);
                out << buf;
            } else {
                out.put(char(c));
            }
        }
    }
    out.put('"');
}

template <typename Number>
void writeNumber(std::ostream& out, Number v)
{
    if (!std::isfinite(v)) {
        out << "null";
        return;
    }
    char buf[40];
    const auto r = std::to_chars(buf, buf + sizeof buf, v);  // shortest round-trip form
    out.write(buf, r.ptr - buf);
}

}  // namespace

void JsonWriter::separate()
{
    if (m_afterKey) {
        m_afterKey = false;
        return;
    }
    if (!m_hasItems.empty()) {
        if (m_hasItems.back())
            m_out.put(',');
        m_hasItems.back() = true;
    }
}

JsonWriter& JsonWriter::beginObject()
{
    separate();
    m_out.put('{');
    m_hasItems.push_back(false);
    return *this;
}

JsonWriter& JsonWriter::endObject()
{
    assert(!m_hasItems.empty() && !m_afterKey);
    m_hasItems.pop_back();
    m_out.put('}');
    return *this;
}

JsonWriter& JsonWriter::beginArray()
{
    separate();
    m_out.put('[');
    m_hasItems.push_back(false);
    return *this;
}

JsonWriter& JsonWriter::endArray()
{
    assert(!m_hasItems.empty() && !m_afterKey);
    m_hasItems.pop_back();
    m_out.put(']');
    return *this;
}

JsonWriter& JsonWriter::key(std::string_view name)
{
    assert(!m_afterKey);
    separate();
    writeString(m_out, name);
    m_out.put(':');
    m_afterKey = true;
    return *this;
}

JsonWriter& JsonWriter::null()
{
    separate();
    m_out << "null";
    return *this;
}

JsonWriter& JsonWriter::value(bool v)
{
    separate();
    m_out << (v ? "true" : "false");
    return *this;
}

JsonWriter& JsonWriter::value(float v)
{
    separate();
    writeNumber(m_out, v);
    return *this;
}

JsonWriter& JsonWriter::value(double v)
{
    separate();
    writeNumber(m_out, v);
    return *this;
}

JsonWriter& JsonWriter::integer(std::int64_t v)
{
    separate();
    writeNumber(m_out, v);
    return *this;
}

JsonWriter& JsonWriter::unsignedInteger(std::uint64_t v)
{
    separate();
    writeNumber(m_out, v);
    return *this;
}

JsonWriter& JsonWriter::value(std::string_view text)
{
    separate();
    writeString(m_out, text);
    return *this;
}

JsonWriter& JsonWriter::value(const nlohmann::json& document)
{
    using Type = nlohmann::json::value_t;
    switch (document.type()) {
    case Type::object:
        beginObject();
        for (const auto& [name, item] : document.items())
            key(name).value(item);
        return endObject();
    case Type::array:
        beginArray();
        for (const nlohmann::json& item : document)
            value(item);
        return endArray();
    case Type::string: return value(document.get_ref<const std::string&>());
    case Type::boolean: return value(document.get<bool>());
    case Type::number_integer: return integer(document.get<std::int64_t>());
    case Type::number_unsigned: return unsignedInteger(document.get<std::uint64_t>());
    case Type::number_float: return value(document.get<double>());
    case Type::binary:  // never built by kvscope; not JSON
    case Type::discarded:
    case Type::null: return null();
    }
    return null();
}

JsonWriter& JsonWriter::floats(const float* values, std::size_t count)
{
    return floatRows(values, 1, count, false);
}

JsonWriter& JsonWriter::floatRows(const float* values, std::size_t rows, std::size_t width)
{
    return floatRows(values, rows, width, true);
}

JsonWriter& JsonWriter::floatRows(const float* values, std::size_t rows, std::size_t width, bool nested)
{
    if (nested)
        beginArray();
    // Formatted into a buffer and written a buffer at a time: one stream call per few thousand
    // numbers instead of two per number (an 80-layer analysis writes tens of millions).
    char buffer[16384];
    std::size_t used = 0;
    for (std::size_t r = 0; r < rows; ++r) {
        beginArray();
        for (std::size_t i = 0; i < width; ++i) {
            if (used > sizeof buffer - 64) {
                m_out.write(buffer, std::streamsize(used));
                used = 0;
            }
            if (i)
                buffer[used++] = ',';
            const float v = values[r * width + i];
            if (!std::isfinite(v)) {
                std::memcpy(buffer + used, "null", 4);
                used += 4;
            } else {
                used = std::size_t(std::to_chars(buffer + used, buffer + sizeof buffer, v).ptr - buffer);
            }
        }
        m_out.write(buffer, std::streamsize(used));
        used = 0;
        endArray();
    }
    return nested ? endArray() : *this;
}

JsonWriter& JsonWriter::strings(const std::vector<std::string>& texts)
{
    beginArray();
    for (const std::string& t : texts)
        value(t);
    return endArray();
}

std::string jsonString(std::string_view text)
{
    std::ostringstream out;
    writeString(out, text);
    return out.str();
}

std::string jsonText(const nlohmann::json& document)
{
    std::ostringstream out;
    JsonWriter(out).value(document);
    return out.str();
}

}  // namespace kvscope
