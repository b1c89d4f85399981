// The layer-buffer allocator: small buffers as std::allocator's, large ones huge-page aligned,
// kept after free and handed out again for the same size, given back on release.

#include "kv/layer_kv.h"
#include "util/buffer_allocator.h"

#include <QTest>

#include <cstdint>
#include <vector>

using namespace kvscope;

class TestBufferAllocator : public QObject {
    Q_OBJECT

private slots:
    void smallBuffersAreOrdinary();
    void largeBuffersAreAlignedAndWritable();
    void aFreedBufferServesTheNextOfItsSize();
    void otherSizesGetTheirOwn();
    void releaseGivesThemBack();
    void keepsNoMoreThanItsBound();
};

namespace {
std::uintptr_t address(const void* p)
{
    return reinterpret_cast<std::uintptr_t>(p);
}
}  // namespace

void TestBufferAllocator::smallBuffersAreOrdinary()
{
    BufferAllocator<float> allocator;
    float* p = allocator.allocate(1000);
    p[0] = 1.0f, p[999] = 2.0f;
    QCOMPARE(p[0] + p[999], 3.0f);
    allocator.deallocate(p, 1000);
}

void TestBufferAllocator::largeBuffersAreAlignedAndWritable()
{
    releaseKeptBuffers();
    FloatBuffer buffer(3 * (kLargeBuffer / sizeof(float)) + 5);  // 3 huge pages and a bit
    QCOMPARE(address(buffer.data()) % kLargeBuffer, std::uintptr_t(0));
    for (std::size_t i = 0; i < buffer.size(); i += 4093)
        buffer[i] = float(i);
    buffer.back() = -1.0f;
    for (std::size_t i = 0; i < buffer.size() - 1; i += 4093)
        QCOMPARE(buffer[i], float(i));
    QCOMPARE(buffer.back(), -1.0f);
}

void TestBufferAllocator::aFreedBufferServesTheNextOfItsSize()
{
    releaseKeptBuffers();
    const std::size_t n = 2 * kLargeBuffer / sizeof(float);
    const float* first = nullptr;
    {
        FloatBuffer a(n);
        first = a.data();
    }
    FloatBuffer b(n);
    QCOMPARE(b.data(), first);  // the same mapping, already faulted in
    FloatBuffer c(n);           // the kept one is in use: a new one
    QVERIFY(c.data() != b.data());
}

void TestBufferAllocator::otherSizesGetTheirOwn()
{
    releaseKeptBuffers();
    const float* first = nullptr;
    {
        FloatBuffer a(2 * kLargeBuffer / sizeof(float));
        first = a.data();
    }
    FloatBuffer b(4 * kLargeBuffer / sizeof(float));  // larger: not served by the smaller one
    QVERIFY(b.data() != first);
    std::fill(b.begin(), b.end(), 1.0f);
    QCOMPARE(b[b.size() - 1], 1.0f);
}

void TestBufferAllocator::releaseGivesThemBack()
{
    releaseKeptBuffers();
    QCOMPARE(keptBufferBytes(), std::size_t(0));
    {
        FloatBuffer a(2 * kLargeBuffer / sizeof(float) - 1);  // rounded up to whole huge pages
        FloatBuffer b(kLargeBuffer / sizeof(float));
        QCOMPARE(keptBufferBytes(), std::size_t(0));  // in use: nothing kept
    }
    QCOMPARE(keptBufferBytes(), 3 * kLargeBuffer);
    releaseKeptBuffers();
    QCOMPARE(keptBufferBytes(), std::size_t(0));
}

void TestBufferAllocator::keepsNoMoreThanItsBound()
{
    releaseKeptBuffers();
    {
        std::vector<FloatBuffer> buffers;
        for (int i = 0; i < 40; ++i)  // 40 x 8 MiB freed at once: more than the 256 MiB kept
            buffers.emplace_back(4 * kLargeBuffer / sizeof(float));
    }
    QCOMPARE(keptBufferBytes(), std::size_t(256) << 20);
    releaseKeptBuffers();
}

QTEST_APPLESS_MAIN(TestBufferAllocator)
#include "tst_buffer_allocator.moc"
