#pragma once
// The one error type for bad input: it always says which file, which object in it, and
// what is wrong, so that a user can find and fix the problem. Text from the file is echoed
// escaped: valid UTF-8 as it is, control characters and invalid bytes as \xNN.

#include <stdexcept>
#include <string>

namespace kvscope {

// `text` safe to print: valid UTF-8 kept, control characters and invalid bytes as \xNN.
inline std::string printable(const std::string& text)
{
    static const char* const hex = "0123456789abcdef";
    std::string out;
    for (std::size_t i = 0; i < text.size();) {
        const unsigned char c = static_cast<unsigned char>(text[i]);
        // The length of a valid UTF-8 sequence starting here (0: not one).
        std::size_t n = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xe ? 3 : (c >> 3) == 0x1e ? 4 : 0;
        if (n > 1 && (i + n > text.size() || c == 0xc0 || c == 0xc1 || c > 0xf4))
            n = 0;
        for (std::size_t k = 1; k < n && n; ++k)
            if ((static_cast<unsigned char>(text[i + k]) >> 6) != 0x2)
                n = 0;
        if (n == 1 && (c < 0x20 || c == 0x7f))
            n = 0;
        if (n == 0) {
            out += "\\x";
            out += hex[c >> 4];
            out += hex[c & 0xf];
            ++i;
        } else {
            out.append(text, i, n);
            i += n;
        }
    }
    return out;
}

class BundleError : public std::runtime_error {
public:
    BundleError(std::string file, std::string object, std::string problem)
        : std::runtime_error(format(file, object, problem))
        , m_file(std::move(file))
        , m_object(std::move(object))
        , m_problem(std::move(problem))
    {
    }

    const std::string& file() const { return m_file; }
    const std::string& object() const { return m_object; }
    const std::string& problem() const { return m_problem; }

private:
    static std::string format(const std::string& file, const std::string& object,
                              const std::string& problem)
    {
        std::string text = file.empty() ? std::string("<memory>") : printable(file);
        if (!object.empty())
            text += ": " + printable(object);
        return text + ": " + printable(problem);
    }

    std::string m_file;
    std::string m_object;
    std::string m_problem;
};

}  // namespace kvscope
