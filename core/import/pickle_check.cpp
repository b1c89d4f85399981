#include "import/pickle_check.h"

#include "format/bundle_error.h"

#include <cstdint>
#include <cstring>

namespace kvscope {

namespace {

// Bytes of argument after the opcode: fixed, a length of `lengthBytes` bytes then that many
// bytes, or text lines. From Python's pickletools, protocols 0-5.
struct Opcode {
    int fixed = 0;
    int lengthBytes = 0;
    int lines = 0;
};

bool describe(unsigned char op, Opcode& out)
{
    static const char* const noArgument = "(.012N)]}aesutldRbo\x81\x85\x86\x87\x88\x89Q\x92\x93\x94\x8f\x90\x91\x97\x98";
    if (op != 0 && std::strchr(noArgument, op))
        return out = {}, true;
    switch (op) {
    case 'K': case 'h': case 'q': case 0x80: case 0x82: out = {1, 0, 0}; return true;
    case 'M': case 0x83: out = {2, 0, 0}; return true;
    case 'J': case 'j': case 'r': case 0x84: out = {4, 0, 0}; return true;
    case 'G': case 0x95: out = {8, 0, 0}; return true;
    case 'U': case 'C': case 0x8c: case 0x8a: out = {0, 1, 0}; return true;
    case 'T': case 'X': case 'B': case 0x8b: out = {0, 4, 0}; return true;
    case 0x8d: case 0x8e: case 0x96: out = {0, 8, 0}; return true;
    case 'I': case 'L': case 'F': case 'S': case 'V': case 'P': case 'g': case 'p': out = {0, 0, 1}; return true;
    case 'c': case 'i': out = {0, 0, 2}; return true;
    default: return false;
    }
}

}  // namespace

void checkPickleLengths(const char* pickle, std::size_t size, const std::string& path, const std::string& entry)
{
    const auto* p = reinterpret_cast<const unsigned char*>(pickle);
    for (std::size_t at = 0; at < size;) {
        Opcode op;
        if (!describe(p[at], op) || p[at] == '.')
            return;  // unknown to this walk, or the end of the pickle
        const std::size_t start = at++;
        if (op.lines) {
            for (int line = 0; line < op.lines; ++line) {
                const void* newline = std::memchr(p + at, '\n', size - at);
                if (!newline)
                    return;
                at = std::size_t(static_cast<const unsigned char*>(newline) - p) + 1;
            }
            continue;
        }
        const std::size_t fieldBytes = std::size_t(op.fixed + op.lengthBytes);
        if (size - at < fieldBytes)
            throw BundleError(path, entry, "the pickle ends inside an opcode at byte " + std::to_string(start));
        std::uint64_t length = 0;
        for (int i = op.lengthBytes - 1; i >= 0; --i)
            length = length << 8 | p[at + std::size_t(i)];
        at += fieldBytes;
        if (op.lengthBytes == 4 && (p[start] == 'T' || p[start] == 0x8b) && (length & 0x80000000u))
            throw BundleError(path, entry, "a negative length at byte " + std::to_string(start));
        if (length > size - at)
            throw BundleError(path, entry, "a value at byte " + std::to_string(start) + " claims " + std::to_string(length) +
                                               " bytes, more than the pickle holds: the file is damaged");
        at += std::size_t(length);
    }
}

}  // namespace kvscope
