// Exact decoding of the KV cache dtypes, on hand-worked bit patterns and full round trips.

#include "format/dtype.h"
#include "format/raw_tensor.h"

#include <QTest>

#include <cmath>

using namespace kvscope;

class TestDType : public QObject {
    Q_OBJECT

private slots:
    void handWorkedValues();
    void everyPatternRoundTrips();
    void roundsToNearestEven();
    void parsesTorchNames();
    void scaleApplies();
};

void TestDType::handWorkedValues()
{
    QCOMPARE(bf16ToFloat(0x3f80), 1.0f);
    QCOMPARE(bf16ToFloat(0xc040), -3.0f);
    QCOMPARE(bf16ToFloat(0x3f81), 1.0f + 1.0f / 128);  // 7 mantissa bits
    QCOMPARE(fp16ToFloat(0x3c00), 1.0f);
    QCOMPARE(fp16ToFloat(0x7bff), 65504.0f);
    QCOMPARE(fp16ToFloat(0x0001), std::ldexp(1.0f, -24));  // smallest subnormal
    QCOMPARE(fp16ToFloat(0xc400), -4.0f);
    QVERIFY(std::isinf(fp16ToFloat(0x7c00)));
    QVERIFY(std::isnan(fp16ToFloat(0x7e00)));
    // e4m3fn: bias 7, no infinities; S.1111.111 is NaN, S.1111.110 = 448.
    QCOMPARE(fp8e4m3ToFloat(0x38), 1.0f);
    QCOMPARE(fp8e4m3ToFloat(0x7e), 448.0f);
    QCOMPARE(fp8e4m3ToFloat(0x01), std::ldexp(1.0f, -9));
    QCOMPARE(fp8e4m3ToFloat(0xb9), -1.125f);
    QVERIFY(std::isnan(fp8e4m3ToFloat(0x7f)));
    QCOMPARE(fp8e4m3ToFloat(0x78), 256.0f);  // exponent 15 is finite in e4m3fn
    // e5m2: bias 15, IEEE-like.
    QCOMPARE(fp8e5m2ToFloat(0x3c), 1.0f);
    QCOMPARE(fp8e5m2ToFloat(0x7b), 57344.0f);
    QCOMPARE(fp8e5m2ToFloat(0x01), std::ldexp(1.0f, -16));
    QVERIFY(std::isinf(fp8e5m2ToFloat(0x7c)));
    QVERIFY(std::isnan(fp8e5m2ToFloat(0x7d)));
}

void TestDType::everyPatternRoundTrips()
{
    for (std::uint32_t b = 0; b < 65536; ++b) {
        const float f = fp16ToFloat(std::uint16_t(b));
        if (!std::isnan(f))
            QCOMPARE(floatToFp16(f), std::uint16_t(b));
        const float g = bf16ToFloat(std::uint16_t(b));
        if (!std::isnan(g))
            QCOMPARE(floatToBf16(g), std::uint16_t(b));
    }
    for (std::uint32_t b = 0; b < 256; ++b) {
        const float e4 = fp8e4m3ToFloat(std::uint8_t(b));
        if (!std::isnan(e4))
            QCOMPARE(floatToFp8e4m3(e4), std::uint8_t(b));
        const float e5 = fp8e5m2ToFloat(std::uint8_t(b));
        if (!std::isnan(e5))
            QCOMPARE(floatToFp8e5m2(e5), std::uint8_t(b));
    }
}

void TestDType::roundsToNearestEven()
{
    // bf16 near 1: ulp 2^-7. Halfway between 1 and 1+ulp goes to even (1); 1.75 ulp goes up.
    QCOMPARE(floatToBf16(1.0f + std::ldexp(1.0f, -8)), std::uint16_t(0x3f80));
    QCOMPARE(floatToBf16(1.0f + 3 * std::ldexp(1.0f, -8)), std::uint16_t(0x3f82));
    QCOMPARE(floatToFp16(1.0f + std::ldexp(1.0f, -11)), std::uint16_t(0x3c00));
    QCOMPARE(floatToFp8e4m3(1.0625f), std::uint8_t(0x38));   // halfway between 1 and 1.125 -> even
    QCOMPARE(floatToFp8e4m3(1.1875f), std::uint8_t(0x3a));   // halfway between 1.125 and 1.25 -> 1.25
    QCOMPARE(floatToFp8e4m3(1000.0f), std::uint8_t(0x7e));   // saturates at 448
    QCOMPARE(floatToFp8e4m3(-1000.0f), std::uint8_t(0xfe));
}

void TestDType::parsesTorchNames()
{
    QCOMPARE(parseDType("torch.bfloat16"), std::optional<DType>(DType::BFloat16));
    QCOMPARE(parseDType("torch.float16"), std::optional<DType>(DType::Float16));
    QCOMPARE(parseDType("float32"), std::optional<DType>(DType::Float32));
    QCOMPARE(parseDType("torch.float8_e4m3fn"), std::optional<DType>(DType::Float8E4M3));
    QCOMPARE(parseDType("torch.float8_e5m2"), std::optional<DType>(DType::Float8E5M2));
    QVERIFY(!parseDType("torch.uint8"));
    QVERIFY(!parseDType("int8"));
    for (DType d : {DType::BFloat16, DType::Float16, DType::Float32, DType::Float8E4M3, DType::Float8E5M2})
        QCOMPARE(parseDType(dtypeName(d)), std::optional<DType>(d));
}

void TestDType::scaleApplies()
{
    const RawTensor t = RawTensor::fromFloat(DType::Float8E4M3, {3}, {0.5f, -2.0f, 10.0f}, 0.25f);
    // Stored values are value / scale: 2, -8, 40, all exact in e4m3.
    QCOMPARE(t.bytes[0], floatToFp8e4m3(2.0f));
    QCOMPARE(t.toFloat(), (std::vector<float>{0.5f, -2.0f, 10.0f}));
}

QTEST_APPLESS_MAIN(TestDType)
#include "tst_dtype.moc"
