// A layer left in its stored tensors: rows decoded on demand (per position, by tiles of
// tokens, or all at once), against values that follow a closed formula.

#include "analysis/layer_rows.h"
#include "kv/layer_source.h"

#include <QTest>

#include <cmath>

using namespace kvscope;

namespace {

// Head h, position p, element d of part `part`: exact in bf16 (a small integer over 8).
float valueAt(KvPart part, int h, std::int64_t p, int d)
{
    return float((part == KvPart::K ? 1 : -1) * ((h * 37 + int(p) * 11 + d * 5) % 61)) / 8.0f;
}

constexpr int kHeads = 4, kDim = 8;
constexpr std::int64_t kSeq = 40;

// Two runs of two heads a position, in two differently laid out tensors:
// run 0 (heads 0-1) bf16 [head][position][dim]; run 1 (heads 2-3) fp32 [position][head][dim].
// Positions 3, 17 and 18 are absent.
struct Fixture {
    RawTensor headMajor[2], positionMajor[2];  // [part]
    LayerSource source;

    Fixture()
    {
        source = LayerSource::absent(kHeads, kSeq, kDim, 2);
        for (KvPart part : {KvPart::K, KvPart::V}) {
            std::vector<float> a, b;
            for (int h = 0; h < 2; ++h)
                for (std::int64_t p = 0; p < kSeq; ++p)
                    for (int d = 0; d < kDim; ++d)
                        a.push_back(valueAt(part, h, p, d));
            for (std::int64_t p = 0; p < kSeq; ++p)
                for (int h = 2; h < 4; ++h)
                    for (int d = 0; d < kDim; ++d)
                        b.push_back(valueAt(part, h, p, d));
            const int i = int(part);
            headMajor[i] = RawTensor::fromFloat(DType::BFloat16, {2, kSeq, kDim}, a);
            positionMajor[i] = RawTensor::fromFloat(DType::Float32, {kSeq, 2, kDim}, b);
        }
        for (std::int64_t p = 0; p < kSeq; ++p) {
            if (p == 3 || p == 17 || p == 18)
                continue;
            for (KvPart part : {KvPart::K, KvPart::V}) {
                HeadRun* runs = source.runs(part, p);
                runs[0] = {&headMajor[int(part)], p * kDim, kSeq * kDim};
                runs[1] = {&positionMajor[int(part)], p * 2 * kDim, kDim};
            }
            source.present[std::size_t(p)] = 1;
        }
    }
};

}  // namespace

class TestLayerSource : public QObject {
    Q_OBJECT

private slots:
    void decodesEveryRunInHeadOrder();
    void materializeMarksAbsentPositionsNaN();
    void tilesServeTokensInAnyOrder();
    void float32IsReadInPlace();
};

void TestLayerSource::decodesEveryRunInHeadOrder()
{
    const Fixture f;
    // Positions 1-5, head-major: runs of consecutive positions on either side of absent 3.
    std::vector<float> heads(std::size_t(5) * kHeads * kDim, -100.0f);
    f.source.decodeHeads(KvPart::V, 1, 6, heads.data());
    for (std::int64_t p = 1; p < 6; ++p)
        for (int h = 0; h < kHeads; ++h)
            for (int d = 0; d < kDim; ++d) {
                const float got = heads[(std::size_t(h) * 5 + std::size_t(p - 1)) * kDim + std::size_t(d)];
                QCOMPARE(got, p == 3 ? -100.0f : valueAt(KvPart::V, h, p, d));  // absent: left as it was
            }
}

void TestLayerSource::materializeMarksAbsentPositionsNaN()
{
    const Fixture f;
    const LayerKv kv = f.source.materialize();
    QCOMPARE(kv.presentCount(), kSeq - 3);
    for (std::int64_t p = 0; p < kSeq; ++p)
        for (int h = 0; h < kHeads; ++h)
            for (int d = 0; d < kDim; ++d) {
                const bool absent = p == 3 || p == 17 || p == 18;
                QCOMPARE(bool(kv.present[std::size_t(p)]), !absent);
                if (absent) {
                    QVERIFY(std::isnan(kv.kAt(h, p)[d]) && std::isnan(kv.vAt(h, p)[d]));
                } else {
                    QCOMPARE(kv.kAt(h, p)[d], valueAt(KvPart::K, h, p, d));
                    QCOMPARE(kv.vAt(h, p)[d], valueAt(KvPart::V, h, p, d));
                }
            }
}

void TestLayerSource::tilesServeTokensInAnyOrder()
{
    const Fixture f;
    const LayerRows rows(f.source);
    QCOMPARE(rows.rowSize(KvPart::K), std::size_t(kHeads * kDim));
    QVERIFY(!rows.present(17) && rows.present(16));
    LayerRows::Tile tile;
    // In order (one tile after another, the last one short), then back and across parts.
    std::vector<std::int64_t> order;
    for (std::int64_t p = 0; p < kSeq; ++p)
        order.push_back(p);
    for (std::int64_t p : {39, 2, 16, 0, 35})
        order.push_back(p);
    for (std::int64_t p : order) {
        if (!rows.present(p))
            continue;
        for (KvPart part : {KvPart::V, KvPart::K}) {
            const RowView row = rows.row(part, p, tile);
            for (int h = 0; h < kHeads; ++h)
                for (int d = 0; d < kDim; ++d)
                    QCOMPARE(row.head(h)[d], valueAt(part, h, p, d));
        }
    }
}

void TestLayerSource::float32IsReadInPlace()
{
    // A reference's layout, [heads, seq, dim], float32 and bf16: the float32 rows point into
    // the stored bytes, the bf16 ones into the tile; both give the formula's values.
    for (DType dtype : {DType::Float32, DType::BFloat16}) {
        RawTensor stored[2];
        LayerSource source = LayerSource::absent(kHeads, kSeq, kDim, 1);
        for (KvPart part : {KvPart::K, KvPart::V}) {
            std::vector<float> values;
            for (int h = 0; h < kHeads; ++h)
                for (std::int64_t p = 0; p < kSeq; ++p)
                    for (int d = 0; d < kDim; ++d)
                        values.push_back(valueAt(part, h, p, d));
            stored[int(part)] = RawTensor::fromFloat(dtype, {kHeads, kSeq, kDim}, values);
            for (std::int64_t p = 0; p < kSeq; ++p)
                source.runs(part, p)[0] = {&stored[int(part)], p * kDim, kSeq * kDim};
        }
        source.present.assign(std::size_t(kSeq), 1);
        const LayerRows rows(source);
        LayerRows::Tile tile;
        for (std::int64_t p : {0, 1, 15, 16, 39, 5})
            for (KvPart part : {KvPart::K, KvPart::V}) {
                const RowView row = rows.row(part, p, tile);
                const auto* data = reinterpret_cast<const std::uint8_t*>(row.data);
                const std::vector<std::uint8_t, BufferAllocator<std::uint8_t>>& bytes = stored[int(part)].bytes;
                const bool inPlace = data >= bytes.data() && data < bytes.data() + bytes.size();
                QCOMPARE(inPlace, dtype == DType::Float32);
                for (int h = 0; h < kHeads; ++h)
                    for (int d = 0; d < kDim; ++d)
                        QCOMPARE(row.head(h)[d], valueAt(part, h, p, d));
            }
    }
}

QTEST_APPLESS_MAIN(TestLayerSource)
#include "tst_layer_source.moc"
