#include "dumps/zip_check.h"

#include "format/bundle_error.h"

#include <cstdint>
#include <cstring>

namespace kvscope {

namespace {

constexpr std::uint32_t kLocalHeader = 0x04034b50, kCentralHeader = 0x02014b50, kEnd = 0x06054b50,
                        kEnd64 = 0x06064b50, kEnd64Locator = 0x07064b50;

class Bytes {
public:
    Bytes(const std::vector<char>& data, const std::string& path) : m_data(data), m_path(path) {}
    std::uint64_t size() const { return m_data.size(); }
    // A little-endian field of `width` bytes at `at`, which must lie inside the file.
    std::uint64_t field(std::uint64_t at, int width, const char* what) const
    {
        if (at > size() || size() - at < std::uint64_t(width))
            fail(std::string(what) + " lies beyond the end of the file");
        std::uint64_t v = 0;
        for (int i = width - 1; i >= 0; --i)
            v = v << 8 | static_cast<unsigned char>(m_data[at + std::uint64_t(i)]);
        return v;
    }
    void require(bool ok, const std::string& problem) const
    {
        if (!ok)
            fail(problem);
    }
    [[noreturn]] void fail(const std::string& problem) const
    {
        throw BundleError(m_path, {}, "not a valid torch.save archive: " + problem);
    }

private:
    const std::vector<char>& m_data;
    const std::string& m_path;
};

// Zip64 sizes and offset of a central directory entry whose 32-bit fields are saturated.
void readZip64Extra(const Bytes& b, std::uint64_t extra, std::uint64_t extraLength, std::uint64_t& uncompressed,
                    std::uint64_t& compressed, std::uint64_t& offset)
{
    for (std::uint64_t at = extra; at + 4 <= extra + extraLength;) {
        const std::uint64_t id = b.field(at, 2, "an extra field"), length = b.field(at + 2, 2, "an extra field");
        b.require(at + 4 + length <= extra + extraLength, "an extra field overruns its entry");
        if (id == 1) {  // only the first counts, as in libtorch's zip reader
            std::uint64_t p = at + 4;
            for (std::uint64_t* value : {&uncompressed, &compressed, &offset})
                if (*value == 0xffffffff) {
                    b.require(p + 8 <= at + 4 + length, "a zip64 extra field is too short");
                    *value = b.field(p, 8, "a zip64 extra field");
                    p += 8;
                }
            return;
        }
        at += 4 + length;
    }
}

}  // namespace

std::string matchingName(std::string name)
{
    for (char& c : name)
        if (c >= 'A' && c <= 'Z')
            c = char(c - 'A' + 'a');
    return name;
}

std::vector<ZipEntry> checkZipStructure(const std::vector<char>& data, const std::string& path)
{
    if (data.size() < 4 || std::memcmp(data.data(), "PK\x03\x04", 4) != 0)
        throw BundleError(path, {}, "is not a zip archive: if it is in the legacy torch.save format, save with the "
                                    "default zip format (no _use_new_zipfile_serialization=False)");
    const Bytes b(data, path);
    b.require(b.size() >= 22, "too short to be a zip archive");
    // The end record: the last signature with room for the record after it, as libtorch's zip
    // reader (miniz) finds it, and its comment must end the file (else a second, unchecked
    // record could hide in the comment of the one checked here).
    std::uint64_t end = b.size() - 22;
    const std::uint64_t earliest = end > 0xffff ? end - 0xffff : 0;
    while (b.field(end, 4, "the end record") != kEnd) {
        b.require(end > earliest, "no end-of-archive record (truncated?)");
        --end;
    }
    b.require(end + 22 + b.field(end + 20, 2, "the end record") == b.size(),
              "the end-of-archive record's comment length disagrees with the file's size");
    std::uint64_t entries = b.field(end + 10, 2, "the end record");
    std::uint64_t directorySize = b.field(end + 12, 4, "the end record");
    std::uint64_t directory = b.field(end + 16, 4, "the end record");
    std::uint64_t directoryEnd = end;
    if (end >= 20 && b.field(end - 20, 4, "the zip64 locator") == kEnd64Locator) {
        const std::uint64_t end64 = b.field(end - 12, 8, "the zip64 locator");
        b.require(end64 + 56 <= end - 20 && b.field(end64, 4, "the zip64 end record") == kEnd64,
                  "the zip64 end record is not where its locator says");
        entries = b.field(end64 + 32, 8, "the zip64 end record");
        directorySize = b.field(end64 + 40, 8, "the zip64 end record");
        directory = b.field(end64 + 48, 8, "the zip64 end record");
        directoryEnd = end64;
    }
    b.require(directory <= directoryEnd && directorySize <= directoryEnd - directory,
              "the central directory lies outside the archive");
    b.require(entries >= 1 && entries <= directorySize / 46, "the entry count does not fit the central directory");
    std::vector<ZipEntry> found;
    std::uint64_t at = directory;
    for (std::uint64_t i = 0; i < entries; ++i) {
        const std::string entry = "central directory entry " + std::to_string(i);
        b.require(at + 46 <= directory + directorySize && b.field(at, 4, "an entry") == kCentralHeader,
                  entry + " is missing or damaged");
        std::uint64_t compressed = b.field(at + 20, 4, "an entry"), uncompressed = b.field(at + 24, 4, "an entry");
        const std::uint64_t nameLength = b.field(at + 28, 2, "an entry"), extraLength = b.field(at + 30, 2, "an entry"),
                            commentLength = b.field(at + 32, 2, "an entry");
        std::uint64_t local = b.field(at + 42, 4, "an entry");
        const std::uint64_t next = at + 46 + nameLength + extraLength + commentLength;
        b.require(next <= directory + directorySize, entry + " overruns the central directory");
        readZip64Extra(b, at + 46 + nameLength, extraLength, uncompressed, compressed, local);
        const std::uint64_t method = b.field(at + 10, 2, "an entry");
        // torch.save stores every entry as it is; libtorch would allocate whatever size a
        // compressed entry claims, before inflating it.
        b.require(method == 0, entry + " is compressed (method " + std::to_string(method) +
                                   "); torch.save stores entries uncompressed");
        b.require(compressed == uncompressed, entry + " is stored with two different sizes");
        // Its local header, name, extra field and data.
        b.require(local < directory && b.field(local, 4, "a local header") == kLocalHeader,
                  entry + " points to no local header");
        const std::uint64_t dataStart =
            local + 30 + b.field(local + 26, 2, "a local header") + b.field(local + 28, 2, "a local header");
        b.require(dataStart <= directory && compressed <= directory - dataStart,
                  entry + "'s data lies beyond the archive's data");
        std::string name(data.data() + at + 46, nameLength);
        // libtorch looks records up by C string: a NUL would make one name stand for another.
        b.require(name.find('\0') == std::string::npos, entry + "'s name holds a NUL byte");
        found.push_back({std::move(name), dataStart, compressed});
        at = next;
    }
    return found;
}

}  // namespace kvscope
