#pragma once
// The one error type for bad input: it always says which file, which object in it, and
// what is wrong, so that a user can find and fix the problem. Text from the file is echoed
// escaped: valid UTF-8 as it is, control characters and invalid bytes as \xNN.

#include "util/utf8.h"

#include <stdexcept>
#include <string>

namespace kvscope {

// `text` safe to print: valid UTF-8 kept, control characters and invalid bytes as \xNN.
inline std::string printable(const std::string& text)
{
    std::string out;
    for (std::size_t i = 0; i < text.size();) {
        const unsigned char c = static_cast<unsigned char>(text[i]);
        const std::size_t n = utf8SequenceLength(text, i);
        if (n == 0 || (n == 1 && (c < 0x20 || c == 0x7f))) {
            out += escapedByte(c);
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
