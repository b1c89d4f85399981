#pragma once
// A 64-bit fingerprint of bytes, the same on every CPU (plain integer arithmetic, words read
// little-endian): tells two captures' references apart without holding either. Not a
// cryptographic digest: it guards against mistakes, not against an adversary.

#include <cstddef>
#include <cstdint>
#include <string>

namespace kvscope {

class ContentHash {
public:
    void add(const void* data, std::size_t bytes);
    void add(std::uint64_t word);
    std::uint64_t value() const;

private:
    std::uint64_t m_state = 0x243f6a8885a308d3ull;  // pi's fraction: any fixed nonzero start
    std::uint64_t m_length = 0;
};

// 16 lowercase hex digits, as the JSON documents write a fingerprint.
std::string hexFingerprint(std::uint64_t value);

}  // namespace kvscope
