#include "util/content_hash.h"

#include <cstring>

namespace kvscope {

namespace {

constexpr std::uint64_t kMultiplier = 0x9e3779b97f4a7c15ull;  // 2^64 / golden ratio

std::uint64_t mix(std::uint64_t state, std::uint64_t word)
{
    state = (state ^ word) * kMultiplier;
    return state ^ (state >> 29);
}

std::uint64_t loadLittleEndian(const unsigned char* p, std::size_t n)
{
    std::uint64_t word = 0;
    for (std::size_t i = 0; i < n; ++i)
        word |= std::uint64_t(p[i]) << (8 * i);
    return word;
}

}  // namespace

void ContentHash::add(const void* data, std::size_t bytes)
{
    const auto* p = static_cast<const unsigned char*>(data);
    std::size_t i = 0;
    for (; i + 8 <= bytes; i += 8) {
        std::uint64_t word;
        std::memcpy(&word, p + i, 8);
#if __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
        word = __builtin_bswap64(word);
#endif
        m_state = mix(m_state, word);
    }
    if (i < bytes)
        m_state = mix(m_state, loadLittleEndian(p + i, bytes - i));
    m_length += bytes;
}

void ContentHash::add(std::uint64_t word)
{
    m_state = mix(m_state, word);
    m_length += 8;
}

std::uint64_t ContentHash::value() const
{
    return mix(m_state, m_length);
}

std::string hexFingerprint(std::uint64_t value)
{
    static const char digits[] = "0123456789abcdef";
    std::string text(16, '0');
    for (int i = 15; i >= 0; --i, value >>= 4)
        text[std::size_t(i)] = digits[value & 15];
    return text;
}

}  // namespace kvscope
