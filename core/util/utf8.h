#pragma once
// Text from files is any bytes; what kvscope prints or writes as JSON must be valid UTF-8.

#include <cstddef>
#include <string>
#include <string_view>

namespace kvscope {

// The length of the valid UTF-8 sequence starting at text[i] (1-4), or 0 when the byte there
// does not start one (RFC 3629: no stray continuation bytes, overlong forms, surrogates,
// code points beyond U+10FFFF, or sequences cut short).
inline std::size_t utf8SequenceLength(std::string_view text, std::size_t i)
{
    const auto at = [&](std::size_t k) { return static_cast<unsigned char>(text[i + k]); };
    const unsigned char c = at(0);
    const std::size_t n = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xe ? 3 : (c >> 3) == 0x1e ? 4 : 0;
    if (n == 0 || i + n > text.size() || c == 0xc0 || c == 0xc1 || c > 0xf4)
        return 0;
    for (std::size_t k = 1; k < n; ++k)
        if ((at(k) >> 6) != 0x2)
            return 0;
    // The second byte's narrower range after these leads.
    if ((c == 0xe0 && at(1) < 0xa0) || (c == 0xed && at(1) > 0x9f) || (c == 0xf0 && at(1) < 0x90) ||
        (c == 0xf4 && at(1) > 0x8f))
        return 0;
    return n;
}

// A byte that is not valid UTF-8, as the four characters \xNN.
inline std::string escapedByte(unsigned char c)
{
    static const char* const hex = "0123456789abcdef";
    return std::string("\\x") + hex[c >> 4] + hex[c & 0xf];
}

}  // namespace kvscope
