// The fingerprint that tells two captures' references apart (util/content_hash.h): the same
// bytes give the same value however they are fed, any changed byte or length changes it,
// and it is printed as 16 hex digits that read back.

#include "util/content_hash.h"

#include <QTest>

#include <cinttypes>
#include <cstdio>
#include <random>
#include <set>
#include <vector>

using namespace kvscope;

class TestContentHash : public QObject {
    Q_OBJECT

private slots:
    void sameBytesSameValue();
    void everyByteAndTheLengthCount();
    void hexReadsBack();
};

namespace {

std::vector<unsigned char> randomBytes(std::size_t n, unsigned seed)
{
    std::mt19937 rng(seed);
    std::vector<unsigned char> bytes(n);
    for (unsigned char& b : bytes)
        b = static_cast<unsigned char>(rng());
    return bytes;
}

std::uint64_t hashOf(const std::vector<unsigned char>& bytes)
{
    ContentHash h;
    h.add(bytes.data(), bytes.size());
    return h.value();
}

}  // namespace

void TestContentHash::sameBytesSameValue()
{
    for (std::size_t n : {0u, 1u, 7u, 8u, 31u, 32u, 33u, 1000u, 4099u}) {
        const auto bytes = randomBytes(n, unsigned(n) + 1);
        QCOMPARE(hashOf(bytes), hashOf(std::vector<unsigned char>(bytes)));
    }
}

void TestContentHash::everyByteAndTheLengthCount()
{
    const auto bytes = randomBytes(1027, 7);
    std::set<std::uint64_t> seen{hashOf(bytes)};
    for (std::size_t i = 0; i < bytes.size(); ++i) {  // one bit of any byte, wherever in the lanes
        auto changed = bytes;
        changed[i] ^= 0x10;
        QVERIFY2(seen.insert(hashOf(changed)).second, qPrintable(QString("byte %1").arg(i)));
    }
    for (std::size_t n = 0; n < 64; ++n)  // zeros appended: a longer input, not the same one
        QVERIFY(seen.insert(hashOf(std::vector<unsigned char>(n, 0))).second);
}

void TestContentHash::hexReadsBack()
{
    for (std::uint64_t v : {std::uint64_t(0), std::uint64_t(1), std::uint64_t(0xfedcba9876543210ull), ~std::uint64_t(0)}) {
        char expected[17];
        std::snprintf(expected, sizeof expected, "%016" PRIx64, v);
        QCOMPARE(hexFingerprint(v), std::string(expected));
    }
}

QTEST_GUILESS_MAIN(TestContentHash)
#include "tst_content_hash.moc"
