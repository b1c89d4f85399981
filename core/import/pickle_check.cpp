#include "import/pickle_check.h"

#include "format/bundle_error.h"

#include <cstdint>
#include <cstring>
#include <deque>

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

// The bytes per element of a storage type torch.save names ("FloatStorage"), or 0.
std::uint64_t itemSize(const std::string& type)
{
    static const std::map<std::string, std::uint64_t> sizes = {
        {"DoubleStorage", 8}, {"FloatStorage", 4}, {"HalfStorage", 2}, {"BFloat16Storage", 2}, {"LongStorage", 8},
        {"IntStorage", 4}, {"ShortStorage", 2}, {"CharStorage", 1}, {"ByteStorage", 1}, {"BoolStorage", 1}};
    const auto it = sizes.find(type);
    return it == sizes.end() ? 0 : it->second;
}

}  // namespace

void checkPickle(const char* pickle, std::size_t size, const std::map<std::string, std::uint64_t>& records,
                 const std::string& prefix, const std::string& path, const std::string& entry)
{
    const auto* p = reinterpret_cast<const unsigned char*>(pickle);
    // The last values pushed, as text ("s:" strings, "g:" globals, "i:" integers), for the
    // persistent ids of storages.
    std::deque<std::string> recent;
    const auto push = [&](std::string value) {
        recent.push_back(std::move(value));
        if (recent.size() > 8)
            recent.pop_front();
    };
    for (std::size_t at = 0; at < size;) {
        Opcode op;
        const unsigned char code = p[at];
        if (!describe(code, op) || code == '.')
            return;  // unknown to this walk, or the end of the pickle
        const std::size_t start = at++;
        if (op.lines) {
            std::string text;
            for (int line = 0; line < op.lines; ++line) {
                const void* newline = std::memchr(p + at, '\n', size - at);
                if (!newline)
                    return;
                const std::size_t end = std::size_t(static_cast<const unsigned char*>(newline) - p);
                text += (line ? " " : "") + std::string(pickle + at, end - at);
                at = end + 1;
            }
            push((code == 'c' ? "g:" : "?:") + text);
            continue;
        }
        const std::size_t fieldBytes = std::size_t(op.fixed + op.lengthBytes);
        if (size - at < fieldBytes)
            throw BundleError(path, entry, "the pickle ends inside an opcode at byte " + std::to_string(start));
        std::uint64_t value = 0;
        for (int i = (op.lengthBytes ? op.lengthBytes : op.fixed) - 1; i >= 0 && (op.lengthBytes || op.fixed <= 4); --i)
            value = value << 8 | p[at + std::size_t(i)];
        at += fieldBytes;
        // libtorch sizes its memo table by the largest index put (a 4-byte index can ask for
        // 64 GB); each memo entry needs an opcode of its own, so no index reaches the pickle's size.
        if (code == 'r' && value >= size)
            throw BundleError(path, entry, "a memo index at byte " + std::to_string(start) + " (" +
                                               std::to_string(value) + ") is beyond what the pickle can hold: the file is damaged");
        if (code == 'K' || code == 'M' || (code == 'J' && !(value & 0x80000000u)))
            push("i:" + std::to_string(value));
        else if (code == 'h' || code == 'j' || code == 'G' || code == 'J' || code == 0x82 || code == 0x83 || code == 0x84)
            push("?");  // other values pushed (memo puts, PROTO and FRAME push nothing)
        if (op.lengthBytes) {
            if (op.lengthBytes == 4 && (code == 'T' || code == 0x8b) && (value & 0x80000000u))
                throw BundleError(path, entry, "a negative length at byte " + std::to_string(start));
            if (value > size - at)
                throw BundleError(path, entry, "a value at byte " + std::to_string(start) + " claims " +
                                                   std::to_string(value) + " bytes, more than the pickle holds: the file is damaged");
            const bool text = code == 'X' || code == 'U' || code == 'T' || code == 0x8c || code == 0x8d;
            push(text ? "s:" + std::string(pickle + at, std::size_t(value)) : "?");
            at += std::size_t(value);
        }
        if (code == 'Q' && recent.size() >= 5) {  // a persistent id: the tuple just built
            const auto n = recent.size();
            const std::string& tag = recent[n - 5];
            const std::string& type = recent[n - 4];
            const std::string& key = recent[n - 3];
            const std::string& numel = recent[n - 1];
            if (tag == "s:storage" && type.starts_with("g:torch ") && key.starts_with("s:") && numel.starts_with("i:")) {
                const std::uint64_t item = itemSize(type.substr(8));
                const auto record = records.find(prefix + "data/" + key.substr(2));
                const std::uint64_t needed = std::stoull(numel.substr(2)) * item;
                if (item && (record == records.end() || record->second < needed))
                    throw BundleError(path, entry, "storage '" + key.substr(2) + "' declares " + std::to_string(needed) +
                                                       " bytes but its record " +
                                                       (record == records.end() ? std::string("is missing")
                                                                                : "holds " + std::to_string(record->second)) +
                                                       ": the file is damaged");
            }
            push("?");
        }
    }
}

}  // namespace kvscope
