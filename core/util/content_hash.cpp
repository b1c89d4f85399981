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

std::uint64_t loadWord(const unsigned char* p)
{
    std::uint64_t word;
    std::memcpy(&word, p, 8);
#if __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    word = __builtin_bswap64(word);
#endif
    return word;
}

}  // namespace

void ContentHash::add(const void* data, std::size_t bytes)
{
    const auto* p = static_cast<const unsigned char*>(data);
    // Four lanes of every fourth word, so that the multiplies do not wait on each other; folded
    // into the state after each call, so the result depends on the bytes and their order only.
    std::uint64_t lanes[4] = {m_state, m_state ^ 1, m_state ^ 2, m_state ^ 3};
    std::size_t i = 0;
    for (; i + 32 <= bytes; i += 32)
        for (int lane = 0; lane < 4; ++lane)
            lanes[lane] = mix(lanes[lane], loadWord(p + i + 8 * std::size_t(lane)));
    for (; i + 8 <= bytes; i += 8)
        lanes[0] = mix(lanes[0], loadWord(p + i));
    if (i < bytes)
        lanes[0] = mix(lanes[0], loadLittleEndian(p + i, bytes - i));
    m_state = mix(mix(mix(lanes[0], lanes[1]), lanes[2]), lanes[3]);
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
