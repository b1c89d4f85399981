#pragma once
// The one way kvscope writes JSON (the analysis, check's verdict, the report's data, bundle
// metadata): strict (RFC 8259) whatever the data. A number that is not finite (NaN: no data)
// is written as null; floats and doubles in their shortest form that reads back to the same
// value; text from files that is not UTF-8 as the text \xNN, so that the output stays valid.
// Streamed: nothing is built in memory, so an 80-layer analysis costs no more than its bytes.
//
//   JsonWriter w(out);
//   w.beginObject().key("layers").value(80).key("ratio").value(1.5f).endObject();
//
// Commas and the colons after keys are the writer's business; a document that is closed
// where it was not opened is a programming error (asserted).

#include <nlohmann/json_fwd.hpp>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <ostream>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

namespace kvscope {

class JsonWriter {
public:
    explicit JsonWriter(std::ostream& out) : m_out(out) {}

    JsonWriter& beginObject();
    JsonWriter& endObject();
    JsonWriter& beginArray();
    JsonWriter& endArray();
    JsonWriter& key(std::string_view name);

    JsonWriter& null();
    JsonWriter& value(bool v);
    JsonWriter& value(float v);
    JsonWriter& value(double v);
    JsonWriter& value(std::string_view text);
    JsonWriter& value(const char* text) { return value(std::string_view(text)); }
    JsonWriter& value(const std::string& text) { return value(std::string_view(text)); }
    template <typename Int, std::enable_if_t<std::is_integral_v<Int> && !std::is_same_v<Int, bool>, int> = 0>
    JsonWriter& value(Int v)
    {
        if constexpr (std::is_signed_v<Int>)
            return integer(std::int64_t(v));
        else
            return unsignedInteger(std::uint64_t(v));
    }
    template <typename T>
    JsonWriter& value(const std::optional<T>& v)
    {
        return v ? value(*v) : null();
    }
    // A document held as nlohmann::json (built up before it is written), under the same rules.
    JsonWriter& value(const nlohmann::json& document);

    // An array of `count` numbers, and of strings.
    JsonWriter& floats(const float* values, std::size_t count);
    // `rows` arrays of `width` numbers each, as one array ([[...], [...]]).
    JsonWriter& floatRows(const float* values, std::size_t rows, std::size_t width);
    // `blocks` arrays of `rows` arrays of `width` numbers ([[[...], ...], ...]); `written(first,
    // count)` is told when values [first, first + count) are written (to let them go).
    JsonWriter& floatBlocks(const float* values, std::size_t blocks, std::size_t rows, std::size_t width,
                            const std::function<void(std::size_t first, std::size_t count)>& written = {});
    // One row of floatRows: [v, ...].
    JsonWriter& floatRow(const float* values, std::size_t width) { return floatRows(values, 1, width, false); }
    JsonWriter& strings(const std::vector<std::string>& texts);
    template <typename T>
    JsonWriter& numbers(const std::vector<T>& values)
    {
        beginArray();
        for (const T& v : values)
            value(v);
        return endArray();
    }
    // An array of `count` items, each written by item(i).
    template <typename Fn>
    JsonWriter& array(std::size_t count, Fn&& item)
    {
        beginArray();
        for (std::size_t i = 0; i < count; ++i)
            item(i);
        return endArray();
    }

    // key(name).value(v)
    template <typename T>
    JsonWriter& field(std::string_view name, const T& v)
    {
        key(name);
        return value(v);
    }

private:
    JsonWriter& floatRows(const float* values, std::size_t rows, std::size_t width, bool nested);
    // `count` numbers in rows of `width` (and blocks of `rowsPerBlock` rows, or none: 0), every
    // bracket but the closing ones after the last; formatted in parts on several threads.
    void writeFloats(const float* values, std::size_t count, std::size_t width, std::size_t rowsPerBlock,
                     const std::function<void(std::size_t, std::size_t)>& written);
    JsonWriter& integer(std::int64_t v);
    JsonWriter& unsignedInteger(std::uint64_t v);
    // Before a value: the comma after the previous one in an array (after a key, nothing).
    void separate();

    std::ostream& m_out;
    std::vector<bool> m_hasItems;  // per open object or array
    bool m_afterKey = false;
};

// A JSON string literal, quotes included, by the writer's rules.
std::string jsonString(std::string_view text);
// A whole value as JSON text (for messages and metadata strings).
std::string jsonText(const nlohmann::json& document);

}  // namespace kvscope
