#include "util/json_writer.h"

#include "util/utf8.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cassert>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <exception>
#include <sstream>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

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

namespace {

// Values [begin, end) of an array of rows of `width` (in blocks of `rowsPerBlock` rows, or
// none: 0) as JSON, each number after what opens or separates it: a comma within a row; "],["
// at a row's start ("]],[[" at a block's); "[" or "[[" first. The closing brackets after the
// last value are the caller's.
void formatFloats(const float* values, std::size_t width, std::size_t rowsPerBlock, std::size_t begin, std::size_t end,
                  std::string& out)
{
    constexpr std::size_t kMostPerValue = 5 + 16;  // "]],[[" and the longest float ("-1.1754944e-38")
    out.resize((end - begin) * kMostPerValue);
    char* at = out.data();
    char* const last = at + out.size();
    const std::size_t blockSize = rowsPerBlock * width;
    for (std::size_t k = begin; k < end; ++k) {
        if (k % width) {
            *at++ = ',';
        } else {
            const char* opening = blockSize == 0 ? (k ? "],[" : "[") : (k % blockSize ? "],[" : k ? "]],[[" : "[[");
            while (*opening)
                *at++ = *opening++;
        }
        const float v = values[k];
        if (!std::isfinite(v)) {
            std::memcpy(at, "null", 4);
            at += 4;
        } else {
            at = std::to_chars(at, last, v).ptr;
        }
    }
    out.resize(std::size_t(at - out.data()));
}

// Past this many numbers an array is formatted by several threads, each a part of a piece of
// the array, the parts written in order (an 80-layer analysis's JSON holds tens of millions of
// numbers, and formatting them is most of writing them); a piece at a time bounds the memory.
constexpr std::size_t kParallelFloats = std::size_t(1) << 15;
constexpr std::size_t kPieceFloats = std::size_t(1) << 20;

}  // namespace

void JsonWriter::writeFloats(const float* values, std::size_t count, std::size_t width, std::size_t rowsPerBlock,
                             const std::function<void(std::size_t, std::size_t)>& written)
{
    const std::size_t parts =
        count < kParallelFloats ? 1 : std::clamp<std::size_t>(std::thread::hardware_concurrency(), 1, 4);
    std::vector<std::string> texts(parts);
    std::vector<std::exception_ptr> failures(parts);
    for (std::size_t piece = 0; piece < count; piece += kPieceFloats) {
        const std::size_t size = std::min(kPieceFloats, count - piece);
        const auto format = [&](std::size_t part) {
            try {
                texts[part].clear();
                formatFloats(values, width, rowsPerBlock, piece + size * part / parts, piece + size * (part + 1) / parts,
                             texts[part]);
            } catch (...) {
                failures[part] = std::current_exception();
            }
        };
        std::vector<std::thread> helpers;
        helpers.reserve(parts);  // (so that only starting a thread can fail below)
        for (std::size_t part = 1; part < parts; ++part)
            try {
                helpers.emplace_back(format, part);
            } catch (const std::system_error&) {  // no thread to be had: this one formats it
                format(part);
            }
        format(0);
        for (std::thread& helper : helpers)
            helper.join();
        for (const std::exception_ptr& failure : failures)
            if (failure)
                std::rethrow_exception(failure);
        for (const std::string& text : texts)
            m_out.write(text.data(), std::streamsize(text.size()));
        if (written)
            written(piece, size);
    }
}

JsonWriter& JsonWriter::floatRows(const float* values, std::size_t rows, std::size_t width, bool nested)
{
    if (nested)
        beginArray();
    else
        separate();
    if (rows * width == 0) {  // no rows, or rows of nothing
        for (std::size_t r = 0; r < rows; ++r)
            m_out.write(r ? ",[]" : "[]", r ? 3 : 2);
    } else {
        writeFloats(values, rows * width, width, 0, {});
        m_out.put(']');
    }
    if (!nested)
        return *this;
    if (rows > 0)
        m_hasItems.back() = true;
    return endArray();
}

JsonWriter& JsonWriter::floatBlocks(const float* values, std::size_t blocks, std::size_t rows, std::size_t width,
                                    const std::function<void(std::size_t first, std::size_t count)>& written)
{
    if (blocks * rows * width == 0)
        return array(blocks, [&](std::size_t b) { floatRows(values + b * rows * width, rows, width); });
    beginArray();
    writeFloats(values, blocks * rows * width, width, rows, written);
    m_out.write("]]", 2);
    m_hasItems.back() = true;
    return endArray();
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
