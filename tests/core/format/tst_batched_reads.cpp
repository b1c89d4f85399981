// Many reads of one file at once (io_uring where the kernel allows it, else preadv each; ctest
// runs this suite both ways): every byte where it belongs, and the first read past the end
// of the file named.

#include "format/batched_reads.h"

#include <QTemporaryFile>
#include <QTest>

#include <fcntl.h>
#include <unistd.h>

#include <cstdint>
#include <random>
#include <vector>

using namespace kvscope;

class TestBatchedReads : public QObject {
    Q_OBJECT

private slots:
    void init();
    void cleanup();
    void scatteredReadsLandInPlace();
    void moreReadsThanTheRingHolds();
    void aReadPastTheEndIsNamed();
    void aReadEndingExactlyAtTheEndIsWhole();

private:
    // The file's byte at `offset` (a pattern no two nearby offsets share).
    static unsigned char byteAt(std::size_t offset) { return static_cast<unsigned char>((offset * 7919u) >> 3); }
    QTemporaryFile m_file;
    int m_fd = -1;
    static constexpr std::size_t kFileBytes = 1 << 20;
};

void TestBatchedReads::init()
{
    QVERIFY(m_file.open());
    std::vector<unsigned char> bytes(kFileBytes);
    for (std::size_t i = 0; i < bytes.size(); ++i)
        bytes[i] = byteAt(i);
    QCOMPARE(m_file.write(reinterpret_cast<const char*>(bytes.data()), qint64(bytes.size())), qint64(bytes.size()));
    m_file.flush();
    m_fd = ::open(m_file.fileName().toLocal8Bit().constData(), O_RDONLY);
    QVERIFY(m_fd >= 0);
}

void TestBatchedReads::cleanup()
{
    ::close(m_fd);
    m_file.close();
    m_file.remove();
}

void TestBatchedReads::scatteredReadsLandInPlace()
{
    // 128 blocks of 4 KiB + a 4-byte "checksum" each, at scattered offsets, two iovecs a read.
    std::mt19937 rng(5);
    std::vector<std::size_t> offsets;
    for (int i = 0; i < 128; ++i)
        offsets.push_back(std::uniform_int_distribution<std::size_t>(0, kFileBytes - 4100)(rng));
    std::vector<unsigned char> data(128 * 4096), sums(128 * 4);
    BatchedReads reads;
    for (std::size_t i = 0; i < offsets.size(); ++i)
        reads.add(off_t(offsets[i]), {{data.data() + i * 4096, 4096}, {sums.data() + i * 4, 4}});
    QCOMPARE(reads.run(m_fd), -1L);
    for (std::size_t i = 0; i < offsets.size(); ++i) {
        for (std::size_t k = 0; k < 4096; k += 511)
            QCOMPARE(data[i * 4096 + k], byteAt(offsets[i] + k));
        QCOMPARE(data[i * 4096 + 4095], byteAt(offsets[i] + 4095));
        QCOMPARE(sums[i * 4 + 3], byteAt(offsets[i] + 4099));
    }
    QCOMPARE(reads.size(), std::size_t(0));  // run() empties it
}

void TestBatchedReads::moreReadsThanTheRingHolds()
{
    std::vector<unsigned char> out(1000 * 16);
    BatchedReads reads;
    for (std::size_t i = 0; i < 1000; ++i)
        reads.add(off_t(i * 1000), {{out.data() + i * 16, 16}});
    QCOMPARE(reads.run(m_fd), -1L);
    for (std::size_t i = 0; i < 1000; ++i)
        QCOMPARE(out[i * 16 + 15], byteAt(i * 1000 + 15));
}

void TestBatchedReads::aReadPastTheEndIsNamed()
{
    std::vector<unsigned char> out(4 * 4096);
    BatchedReads reads;
    reads.add(0, {{out.data(), 4096}});
    reads.add(off_t(kFileBytes - 100), {{out.data() + 4096, 4096}});  // 100 bytes, then the end
    reads.add(off_t(kFileBytes + 4096), {{out.data() + 8192, 4096}});  // wholly past it
    reads.add(4096, {{out.data() + 12288, 4096}});
    QCOMPARE(reads.run(m_fd), 1L);
    QCOMPARE(out[4095], byteAt(4095));
    QCOMPARE(out[4096 + 99], byteAt(kFileBytes - 1));  // what there was, was read
}

void TestBatchedReads::aReadEndingExactlyAtTheEndIsWhole()
{
    std::vector<unsigned char> out(8192);
    BatchedReads reads;
    reads.add(off_t(kFileBytes - 4096), {{out.data(), 4000}, {out.data() + 4000, 96}});
    reads.add(0, {{out.data() + 4096, 4096}});
    QCOMPARE(reads.run(m_fd), -1L);
    QCOMPARE(out[4095], byteAt(kFileBytes - 1));
    QCOMPARE(out[4000], byteAt(kFileBytes - 96));
}

QTEST_APPLESS_MAIN(TestBatchedReads)
#include "tst_batched_reads.moc"
