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
    void everyFp8CodeDecodes();
    void everyBf16PatternEncodes();
};

namespace {

// The formats as their specifications define them, written here independently of
// format/minifloat.h: bits, bias, and what the top codes mean.
struct FormatSpec {
    const char* name;
    int exponentBits, mantissaBits, bias;
    bool ieeeSpecials;  // e5m2: exponent all ones is Inf (mantissa 0) or NaN
    bool fnNan;         // e4m3fn: S.1111.111 is NaN, every other code finite
    bool fnuz;          // e4m3fnuz: 0x80 is NaN, no negative zero, every other code finite
    std::uint8_t (*encode)(float);
    float (*decode)(std::uint8_t);
};

const FormatSpec kFormats[] = {
    {"e4m3fn", 4, 3, 7, false, true, false, floatToFp8e4m3, fp8e4m3ToFloat},
    {"e4m3fnuz", 4, 3, 8, false, false, true, floatToFp8e4m3fnuz, fp8e4m3fnuzToFloat},
    {"e5m2", 5, 2, 15, true, false, false, floatToFp8e5m2, fp8e5m2ToFloat},
};

// NaN for NaN codes, +-Inf for infinities; in double, from sign x 2^(e - bias) x 1.m.
double specValue(const FormatSpec& f, unsigned code)
{
    const unsigned sign = code >> 7, exponent = (code >> f.mantissaBits) & ((1u << f.exponentBits) - 1),
                   mantissa = code & ((1u << f.mantissaBits) - 1);
    const unsigned topExponent = (1u << f.exponentBits) - 1;
    if (f.fnuz && code == 0x80)
        return std::nan("");
    if (f.fnNan && exponent == topExponent && mantissa == (1u << f.mantissaBits) - 1)
        return std::nan("");
    if (f.ieeeSpecials && exponent == topExponent)
        return mantissa ? std::nan("") : (sign ? -INFINITY : INFINITY);
    const double fraction = double(mantissa) / double(1u << f.mantissaBits);
    const double magnitude = exponent == 0 ? fraction * std::pow(2.0, 1 - f.bias)
                                           : (1.0 + fraction) * std::pow(2.0, int(exponent) - f.bias);
    return sign ? -magnitude : magnitude;
}

// The code the specification gives `x`: the nearest finite value of x's sign (ties to the even
// code), saturating beyond the largest; +-0 keeps its sign except in fnuz.
unsigned specEncode(const FormatSpec& f, double x)
{
    const bool negative = std::signbit(x);
    double largest = 0;
    unsigned largestCode = 0;
    for (unsigned code = 0; code < 128; ++code)
        if (std::isfinite(specValue(f, code)) && specValue(f, code) > largest)
            largest = specValue(f, code), largestCode = code;
    if (std::fabs(x) >= largest)  // saturation (a distance in double cannot tell 416 from 448 at 1e18)
        return largestCode | (negative ? 0x80u : 0u);
    unsigned best = 0;
    double bestDistance = INFINITY;
    for (unsigned code = 0; code < 256; ++code) {
        const double v = specValue(f, code);
        if (!std::isfinite(v) || (std::signbit(v) != negative && !(f.fnuz && code == 0)))
            continue;
        const double d = std::isinf(x) ? -std::fabs(v) : std::fabs(x - v);  // Inf: the largest
        if (d < bestDistance || (d == bestDistance && (code & 1) == 0 && (best & 1) == 1)) {
            best = code;
            bestDistance = d;
        }
    }
    return best;
}

}  // namespace

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
        if (std::isfinite(e5))  // an infinity saturates (as engines store fp8): see everyBf16PatternEncodes
            QCOMPARE(floatToFp8e5m2(e5), std::uint8_t(b));
        const float z = fp8e4m3fnuzToFloat(std::uint8_t(b));
        if (!std::isnan(z))
            QCOMPARE(floatToFp8e4m3fnuz(z), std::uint8_t(b));
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
    QVERIFY(!parseDType("int4"));
    QCOMPARE(parseDType("torch.float8_e4m3fnuz"), std::optional<DType>(DType::Float8E4M3Fnuz));
    QCOMPARE(parseDType("int8"), std::optional<DType>(DType::Int8));
    for (DType d : {DType::BFloat16, DType::Float16, DType::Float32, DType::Float8E4M3, DType::Float8E5M2, DType::Float8E4M3Fnuz, DType::Int8})
        QCOMPARE(parseDType(dtypeName(d)), std::optional<DType>(d));
}

void TestDType::scaleApplies()
{
    const RawTensor t = RawTensor::fromFloat(DType::Float8E4M3, {3}, {0.5f, -2.0f, 10.0f}, 0.25f);
    // Stored values are value / scale: 2, -8, 40, all exact in e4m3.
    QCOMPARE(t.bytes[0], floatToFp8e4m3(2.0f));
    QCOMPARE(t.toFloat(), (std::vector<float>{0.5f, -2.0f, 10.0f}));
}

void TestDType::everyFp8CodeDecodes()
{
    for (const FormatSpec& f : kFormats) {
        int nans = 0;
        for (unsigned code = 0; code < 256; ++code) {
            const double expected = specValue(f, code);
            const float decoded = f.decode(std::uint8_t(code));
            if (std::isnan(expected)) {
                QVERIFY2(std::isnan(decoded), f.name);
                ++nans;
                continue;
            }
            if (double(decoded) != expected || std::signbit(decoded) != std::signbit(expected))
                QFAIL(qPrintable(QString("%1 code 0x%2: %3, expected %4").arg(f.name).arg(code, 2, 16, QChar('0'))
                                     .arg(double(decoded), 0, 'g', 17).arg(expected, 0, 'g', 17)));
        }
        QCOMPARE(nans, f.fnuz ? 1 : f.fnNan ? 2 : 6);
    }
    QCOMPARE(fp8e4m3ToFloat(0x7e), 448.0f);
    QCOMPARE(fp8e4m3fnuzToFloat(0x7f), 240.0f);
    QCOMPARE(fp8e5m2ToFloat(0x7b), 57344.0f);
}

void TestDType::everyBf16PatternEncodes()
{
    for (const FormatSpec& f : kFormats) {
        for (unsigned pattern = 0; pattern < 65536; ++pattern) {
            const float x = bf16ToFloat(std::uint16_t(pattern));
            const std::uint8_t code = f.encode(x);
            if (std::isnan(x)) {
                QVERIFY2(std::isnan(f.decode(code)), f.name);
                continue;
            }
            const unsigned expected = specEncode(f, double(x));
            if (code != expected)
                QFAIL(qPrintable(QString("%1: bf16 0x%2 (%3) -> 0x%4, expected 0x%5").arg(f.name)
                                     .arg(pattern, 4, 16, QChar('0')).arg(double(x), 0, 'g', 9)
                                     .arg(code, 2, 16, QChar('0')).arg(expected, 2, 16, QChar('0'))));
        }
    }
    // int8: round half to even, saturating to [-128, 127].
    for (unsigned pattern = 0; pattern < 65536; ++pattern) {
        const float x = bf16ToFloat(std::uint16_t(pattern));
        if (std::isnan(x))
            continue;
        const double clamped = std::min(127.0, std::max(-128.0, double(x)));
        double expected = std::floor(clamped);
        if (clamped - expected > 0.5 || (clamped - expected == 0.5 && std::fmod(expected, 2.0) != 0))
            expected += 1;
        QCOMPARE(double(std::int8_t(floatToInt8(x))), expected);
    }
}

QTEST_APPLESS_MAIN(TestDType)
#include "tst_dtype.moc"
