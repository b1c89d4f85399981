// vLLM's 4-bit KV caches, NVFP4 and int4_per_token_head: exact decoding of every code against
// references written here in double from the formats' definitions, the Walsh-Hadamard transform
// against the O(d^2) matrix product, quantisation as vLLM's kernels do it against a double
// reference, bundles round trip bit for bit, and a damaged one names its dataset.

#include "format/bundle_reader.h"
#include "format/bundle_writer.h"
#include "format/hadamard.h"
#include "format/int4_rht.h"
#include "format/nvfp4.h"
#include "test_support.h"

#include <QTemporaryDir>
#include <QTest>

#include <hdf5.h>

#include <bit>
#include <cmath>
#include <random>

using namespace kvscope;
using namespace kvtest;

class TestFourBitFormats : public QObject {
    Q_OBJECT

private slots:
    void parsesVllmNames();
    void everyNvfp4CodeAndScaleDecodes();
    void e2m1RoundsToNearestEven();
    void nvfp4QuantisesAsVllm();
    void hadamardIsTheMatrixProduct();
    void everyInt4CodeAndZeroPointDecodes();
    void int4QuantisesAsVllm();
    void int4DecodesPartsOfRows();
    void bundlesRoundTrip();
    void damagedBundleNamesTheDataset();
    void configValidatesTheFormats();
};

namespace {

// e2m1 from its definition: sign bit 3, exponent bits 2-1 (bias 1), mantissa bit 0.
double e2m1Reference(unsigned code)
{
    const unsigned exponent = (code >> 1) & 3, mantissa = code & 1;
    const double magnitude = exponent == 0 ? 0.5 * mantissa : (1.0 + 0.5 * mantissa) * std::ldexp(1.0, int(exponent) - 1);
    return code & 8 ? -magnitude : magnitude;
}

// OCP e4m3fn: bias 7, subnormals, S.1111.111 NaN.
double e4m3Reference(unsigned bits)
{
    const unsigned exponent = (bits >> 3) & 15, mantissa = bits & 7;
    if (exponent == 15 && mantissa == 7)
        return std::nan("");
    const double magnitude = exponent == 0 ? mantissa / 8.0 * std::ldexp(1.0, -6) : (1 + mantissa / 8.0) * std::ldexp(1.0, int(exponent) - 7);
    return bits & 0x80 ? -magnitude : magnitude;
}

// The nearest of `grid` (increasing magnitudes, codes in order) to |x|, ties to the even code,
// saturated to the last: written apart from format/minifloat.h.
int nearestCode(const std::vector<double>& grid, double x)
{
    const double m = std::fabs(x);
    int best = 0;
    for (int c = 1; c < int(grid.size()); ++c) {
        const double d = std::fabs(grid[std::size_t(c)] - m), e = std::fabs(grid[std::size_t(best)] - m);
        if (d < e || (d == e && c % 2 == 0))
            best = c;
    }
    return best;
}

std::vector<double> e2m1Grid()
{
    std::vector<double> g;
    for (unsigned c = 0; c < 8; ++c)
        g.push_back(e2m1Reference(c));
    return g;
}

std::vector<double> e4m3Grid()
{
    std::vector<double> g;
    for (unsigned c = 0; c < 127; ++c)  // 0x7f is NaN
        g.push_back(e4m3Reference(c));
    return g;
}

// H[i][j] = (-1)^popcount(i & j), Sylvester's order.
double hadamardEntry(int i, int j)
{
    return std::popcount(unsigned(i & j)) % 2 ? -1.0 : 1.0;
}

std::vector<double> matrixProduct(const std::vector<double>& x)
{
    const int d = int(x.size());
    std::vector<double> y(x.size(), 0.0);
    for (int i = 0; i < d; ++i)
        for (int j = 0; j < d; ++j)
            y[std::size_t(i)] += hadamardEntry(i, j) * x[std::size_t(j)];
    return y;
}

// A row decoded in double from the definition: signs * H((q - zp) * scale) / d.
std::vector<double> int4Reference(const std::vector<std::uint8_t>& codes, double scale, int zeroPoint,
                                  const std::vector<std::int8_t>& signs)
{
    std::vector<double> rotated;
    for (std::uint8_t q : codes)
        rotated.push_back((int(q) - zeroPoint) * scale);
    std::vector<double> x = matrixProduct(rotated);
    for (std::size_t i = 0; i < x.size(); ++i)
        x[i] = x[i] / double(x.size()) * signs[i];
    return x;
}

std::vector<std::int8_t> randomSigns(int d, std::mt19937& rng)
{
    std::vector<std::int8_t> s;
    for (int i = 0; i < d; ++i)
        s.push_back(rng() % 2 ? 1 : -1);
    return s;
}

bool sameFloat(float a, float b)
{
    return std::bit_cast<std::uint32_t>(a) == std::bit_cast<std::uint32_t>(b) || (std::isnan(a) && std::isnan(b));
}

}  // namespace

void TestFourBitFormats::parsesVllmNames()
{
    QCOMPARE(parseDType("nvfp4"), std::optional(DType::Float4E2M1));
    QCOMPARE(parseDType("float4_e2m1fn"), std::optional(DType::Float4E2M1));
    QCOMPARE(parseDType("int4_per_token_head"), std::optional(DType::Int4TokenHead));
    QCOMPARE(parseDType("fp8_per_token_head"), std::optional(DType::Float8E4M3));
    QCOMPARE(parseDType("int8_per_token_head"), std::optional(DType::Int8));
    QCOMPARE(dtypeName(DType::Float4E2M1), std::string("float4_e2m1fn"));
    QCOMPARE(configDTypeName(DType::Float4E2M1), std::string("nvfp4"));
    QCOMPARE(configDTypeName(DType::Int4TokenHead), std::string("int4_per_token_head"));
    QVERIFY(isQuantised(DType::Float4E2M1) && isQuantised(DType::Int4TokenHead));
    QCOMPARE(unitRoundoff(DType::Float4E2M1), 0.25);
    QCOMPARE(dtypeSize(DType::Float4E2M1), std::size_t(1));
}

void TestFourBitFormats::everyNvfp4CodeAndScaleDecodes()
{
    // [1, 1, 256, 16]: row b holds the 16 codes under block scale bits b; a global scale that
    // makes the product round.
    const float global = 0.3f;
    RawTensor t;
    t.dtype = DType::Float4E2M1;
    t.shape = {1, 1, 256, 16};
    std::vector<float> scales;
    for (unsigned b = 0; b < 256; ++b) {
        scales.push_back(fp8e4m3ToFloat(std::uint8_t(b)));
        for (unsigned c = 0; c < 16; ++c)
            t.bytes.push_back(std::uint8_t(c));
    }
    t.setScales(ScaleGranularity::TokenGroup, scales);
    t.scale = global;
    const std::vector<float> decoded = t.toFloat();
    int nans = 0;
    for (unsigned b = 0; b < 256; ++b)
        for (unsigned c = 0; c < 16; ++c) {
            QVERIFY(sameFloat(e2m1ToFloat(std::uint8_t(c)), float(e2m1Reference(c))));
            // The exact product e2m1 x e4m3 x global, rounded once to float.
            const double exact = e2m1Reference(c) * e4m3Reference(b) * double(global);
            const float got = decoded[b * 16 + c];
            if (std::isnan(exact)) {
                QVERIFY2(std::isnan(got), qPrintable(QString("code %1 scale 0x%2").arg(c).arg(b, 0, 16)));
                ++nans;
                continue;
            }
            QVERIFY2(sameFloat(got, float(exact)) || (exact == 0 && got == 0),
                     qPrintable(QString("code %1 scale 0x%2: %3, expected %4").arg(c).arg(b, 0, 16).arg(got).arg(exact)));
        }
    QCOMPARE(nans, 2 * 16);  // 0x7f and 0xff
    QVERIFY(std::isnan(e2m1ToFloat(16)));  // not a code
}

void TestFourBitFormats::e2m1RoundsToNearestEven()
{
    // Hand-worked: ties go to the even mantissa; beyond 6 saturates.
    const std::pair<float, float> cases[] = {{0.25f, 0.0f}, {0.26f, 0.5f}, {0.75f, 1.0f}, {1.25f, 1.0f},
                                             {1.75f, 2.0f}, {2.5f, 2.0f},  {3.5f, 4.0f},  {5.0f, 4.0f},
                                             {5.1f, 6.0f},  {7.0f, 6.0f},  {1e9f, 6.0f},  {-2.5f, -2.0f},
                                             {-0.75f, -1.0f}};
    for (const auto& [x, expected] : cases) {
        QCOMPARE(roundToDType(DType::Float4E2M1, x), expected);
        QCOMPARE(e2m1ToFloat(floatToE2M1(x)), expected);
    }
    for (unsigned c = 0; c < 16; ++c)
        if (c != 8)  // -0 encodes as itself too, but compares equal to +0
            QCOMPARE(floatToE2M1(e2m1ToFloat(std::uint8_t(c))), std::uint8_t(c));
    QCOMPARE(floatToUInt4(2.5f), std::uint8_t(3));  // half away from zero
    QCOMPARE(floatToUInt4(-0.4f), std::uint8_t(0));
    QCOMPARE(floatToUInt4(15.6f), std::uint8_t(15));
}

void TestFourBitFormats::nvfp4QuantisesAsVllm()
{
    // Hand-worked: amax 12 under global 1 gives SF 2 (e4m3 exact); 5 / 2 = 2.5 ties to 2.
    const float x[16] = {12, 5, -3, 0.5f, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 7};
    std::uint8_t codes[16];
    QCOMPARE(fp8e4m3ToFloat(nvfp4QuantiseBlock(x, 16, 1.0f, codes)), 2.0f);
    // 0.5 / 2 = 0.25 ties to 0, 7 / 2 = 3.5 between 3 (odd mantissa) and 4 goes to 4.
    const float expected[16] = {6, 2, -1.5f, 0, 0.5f, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 4};
    for (int i = 0; i < 16; ++i)
        QCOMPARE(e2m1ToFloat(codes[i]), expected[i]);

    // Against the formula in double, with a global scale that is a power of two (so that the
    // float and double divisions agree) and random blocks.
    std::mt19937 rng(5);
    std::normal_distribution<float> n01;
    const std::vector<double> g2 = e2m1Grid(), g4 = e4m3Grid();
    for (int block = 0; block < 500; ++block) {
        const float global = std::ldexp(1.0f, int(rng() % 12) - 8);
        float v[16];
        double amax = 0;
        const float magnitude = std::ldexp(1.0f, int(rng() % 16) - 8);
        for (float& e : v)
            amax = std::max(amax, std::fabs(double(e = n01(rng) * magnitude)));
        const double sfWanted = amax / global / 6.0;
        const double sf = sfWanted >= 448 ? 448 : g4[std::size_t(nearestCode(g4, sfWanted))];
        const std::uint8_t bits = nvfp4QuantiseBlock(v, 16, global, codes);
        QCOMPARE(double(fp8e4m3ToFloat(bits)), sf);
        for (int i = 0; i < 16; ++i) {
            const double q = sf > 0 ? double(v[i]) / global / sf : 0;
            const double value = (q < 0 ? -1 : 1) * g2[std::size_t(nearestCode(g2, q))];
            QCOMPARE(double(e2m1ToFloat(codes[i])), sf > 0 ? value : 0.0);
        }
    }
    // A whole tensor decodes to code x SF x global, each block its own SF.
    std::vector<float> values(2 * 2 * 4 * 32);
    for (float& e : values)
        e = n01(rng);
    const RawTensor t = nvfp4Tensor({2, 2, 4, 32}, values, nvfp4GlobalScale(4.0f));
    QCOMPARE(t.scalesShape(), (std::vector<std::int64_t>{2, 2, 4, 2}));
    const std::vector<float> back = t.toFloat();
    for (std::size_t i = 0; i < values.size(); ++i)
        QVERIFY(sameFloat(back[i], e2m1ToFloat(t.bytes[i]) * t.scales[i / 16] * t.scale));
}

void TestFourBitFormats::hadamardIsTheMatrixProduct()
{
    std::mt19937 rng(3);
    std::uniform_int_distribution<int> small(-1000, 1000);
    for (int d = 1; d <= 512; d *= 2) {
        std::vector<double> x;
        for (int i = 0; i < d; ++i)
            x.push_back(small(rng));  // integers: both sums are exact
        const std::vector<double> expected = matrixProduct(x);
        std::vector<double> fast = x;
        walshHadamard(fast.data(), d);
        QCOMPARE(fast, expected);
        std::vector<float> single(x.begin(), x.end());
        walshHadamard(single.data(), d);
        for (int i = 0; i < d; ++i)
            QCOMPARE(double(single[std::size_t(i)]), expected[std::size_t(i)]);
        walshHadamard(fast.data(), d);  // twice: d times the input
        for (int i = 0; i < d; ++i)
            QCOMPARE(fast[std::size_t(i)], x[std::size_t(i)] * d);
    }
    QVERIFY(!isPowerOfTwo(48) && isPowerOfTwo(64));
}

void TestFourBitFormats::everyInt4CodeAndZeroPointDecodes()
{
    // Every code under every zero point: rows of the 16 codes (two of them, d = 32, in shuffled
    // order), decoded bit for bit as the double reference rounded once.
    std::mt19937 rng(11);
    const int d = 32;
    const std::vector<std::int8_t> signs = randomSigns(d, rng);
    for (int zp = 0; zp < 16; ++zp) {
        std::vector<std::uint8_t> codes;
        for (int i = 0; i < d; ++i)
            codes.push_back(std::uint8_t(i % 16));
        std::shuffle(codes.begin(), codes.end(), rng);
        const float scale = std::ldexp(1.0f + float(rng() % 4096) / 4096.0f, int(rng() % 20) - 14);
        std::vector<float> got(static_cast<std::size_t>(d));
        int4RhtDecode(codes.data(), d, scale, zp, signs.data(), got.data());
        const std::vector<double> expected = int4Reference(codes, scale, zp, signs);
        for (int i = 0; i < d; ++i)
            QVERIFY2(sameFloat(got[std::size_t(i)], float(expected[std::size_t(i)])),
                     qPrintable(QString("zp %1 value %2: %3, expected %4").arg(zp).arg(i).arg(got[std::size_t(i)]).arg(expected[std::size_t(i)])));
    }
    // One code each: the row is the code's column of H, scaled.
    std::vector<std::uint8_t> codes(std::size_t(d), 7);
    codes[5] = 9;
    std::vector<float> got(static_cast<std::size_t>(d));
    int4RhtDecode(codes.data(), d, 0.5f, 7, signs.data(), got.data());
    for (int i = 0; i < d; ++i)
        QCOMPARE(got[std::size_t(i)], float(hadamardEntry(i, 5) * 2 * 0.5 / d * signs[std::size_t(i)]));
}

void TestFourBitFormats::int4QuantisesAsVllm()
{
    std::mt19937 rng(13);
    std::normal_distribution<double> n01;
    for (int d : {16, 64, 128}) {
        const std::vector<std::int8_t> signs = randomSigns(d, rng);
        for (int row = 0; row < 50; ++row) {
            std::vector<float> x;
            for (int i = 0; i < d; ++i)
                x.push_back(float(n01(rng) * (row % 5 == 0 ? 1e-9 : 1.0)));  // some rows below the scale's floor
            // The reference, in double: rotate, asymmetric over the row.
            std::vector<double> signed_;
            for (int i = 0; i < d; ++i)
                signed_.push_back(double(x[std::size_t(i)]) * signs[std::size_t(i)]);
            const std::vector<double> rotated = matrixProduct(signed_);
            const double lo = *std::min_element(rotated.begin(), rotated.end()), hi = *std::max_element(rotated.begin(), rotated.end());
            const double scale = std::max((hi - lo) / 15, 1e-6);
            const int zp = int(std::clamp(std::round(-lo / scale), 0.0, 15.0));
            std::vector<std::uint8_t> codes(static_cast<std::size_t>(d));
            const Int4RhtRow got = int4RhtQuantise(x.data(), d, signs.data(), codes.data());
            QVERIFY(std::fabs(got.scale - scale) <= 1e-6 * scale);
            QCOMPARE(int(got.zeroPoint), zp);
            for (int i = 0; i < d; ++i)
                QCOMPARE(int(codes[std::size_t(i)]), int(std::clamp(std::round(rotated[std::size_t(i)] / scale + zp), 0.0, 15.0)));
            // Its decode is within the rotated error's bound: scale / 2 per rotated value, so
            // sqrt(d) x scale / 2 / d... at most scale / 2 x sqrt(d) / sqrt(d) per value in L2 / d.
            std::vector<float> back(static_cast<std::size_t>(d));
            int4RhtDecode(codes.data(), d, got.scale, got.zeroPoint, signs.data(), back.data());
            double err2 = 0;
            for (int i = 0; i < d; ++i)
                err2 += std::pow(double(back[std::size_t(i)]) - x[std::size_t(i)], 2);
            // ||x - x'|| = ||H (r - r')|| / d = ||r - r'|| / sqrt(d) <= sqrt(d) (scale / 2) / sqrt(d)
            QVERIFY(std::sqrt(err2) <= scale / 2 * 1.0001 + 1e-12);
        }
    }
    // Requantising a row with its own scale and zero point gives its decode back.
    const std::vector<std::int8_t> signs = kvscopeRhtSigns(32);
    QCOMPARE(signs.size(), std::size_t(32));
    QVERIFY(std::all_of(signs.begin(), signs.end(), [](std::int8_t s) { return s == 1 || s == -1; }));
    QVERIFY(std::count(signs.begin(), signs.end(), std::int8_t(-1)) > 4);
    std::vector<float> x(32);
    for (float& e : x)
        e = float(n01(rng));
    std::vector<std::uint8_t> codes(32);
    const Int4RhtRow r = int4RhtQuantise(x.data(), 32, signs.data(), codes.data());
    std::vector<float> decoded(32), again(32);
    int4RhtDecode(codes.data(), 32, r.scale, r.zeroPoint, signs.data(), decoded.data());
    int4RhtRequantise(x.data(), 32, r.scale, r.zeroPoint, signs.data(), again.data());
    QCOMPARE(again, decoded);
}

void TestFourBitFormats::int4DecodesPartsOfRows()
{
    std::mt19937 rng(17);
    std::normal_distribution<float> n01;
    std::vector<float> values(3 * 2 * 4 * 16);
    for (float& e : values)
        e = n01(rng);
    const RawTensor t = int4RhtTensor({3, 2, 4, 16}, values, randomSigns(16, rng));
    QCOMPARE(t.scalesShape(), (std::vector<std::int64_t>{3, 2, 4}));
    const std::vector<float> whole = t.toFloat();
    for (std::int64_t offset : {0, 5, 16, 37})
        for (std::int64_t count : {1, 11, 16, 40}) {
            std::vector<float> part(static_cast<std::size_t>(count));
            t.decode(offset, count, part.data());
            for (std::int64_t i = 0; i < count; ++i)
                QVERIFY(sameFloat(part[std::size_t(i)], whole[std::size_t(offset + i)]));
        }
    // Without its signs a row is not decodable: NaN, never a guess.
    RawTensor unsigned_ = t;
    unsigned_.rhtSigns.clear();
    QVERIFY(std::isnan(unsigned_.toFloat()[0]));
}

namespace {

const std::vector<std::string> kLayers{"layers.0.self_attn", "layers.1.self_attn", "layers.2.self_attn"};

// nvfp4, int4 and fp8 K / nvfp4 V groups sharing one table, head_size 32, 2 heads over TP 2.
KvCacheConfig fourBitConfig()
{
    std::string json = configJson(10, 2, 2, 32, {{{kLayers[0]}, "FullAttentionSpec", 4},
                                                 {{kLayers[1]}, "FullAttentionSpec", 4},
                                                 {{kLayers[2]}, "FullAttentionSpec", 4}});
    // (configJson gives every group one dtype: set each group's)
    const auto setDtype = [&](int group, const std::string& dtype) {
        std::size_t at = 0;
        for (int g = 0; g <= group; ++g)
            at = json.find("\"dtype\": \"torch.float32\"", at + 1);
        json.replace(at, std::string("\"dtype\": \"torch.float32\"").size(), dtype);
    };
    setDtype(2, "\"dtype\": \"float8_e4m3fn\", \"v_dtype\": \"nvfp4\"");
    setDtype(1, "\"dtype\": \"int4_per_token_head\"");
    setDtype(0, "\"dtype\": \"nvfp4\"");
    return KvCacheConfig::fromJson(json);
}

RawTensor fourBitTensor(DType dtype, std::mt19937& rng, const std::vector<std::int8_t>& signs)
{
    std::normal_distribution<float> n01;
    std::vector<float> values(10 * 1 * 4 * 32);
    for (float& e : values)
        e = n01(rng);
    if (dtype == DType::Float4E2M1)
        return nvfp4Tensor({10, 1, 4, 32}, values, 0.0123f);
    if (dtype == DType::Int4TokenHead)
        return int4RhtTensor({10, 1, 4, 32}, values, signs);
    return RawTensor::fromFloat(dtype, {10, 1, 4, 32}, values, 0.05f);
}

struct FourBitBundle {
    KvCacheConfig config = fourBitConfig();
    EngineSnapshot snapshot;
};

FourBitBundle writeFourBit(const std::string& path, bool keepOnlyReferenced)
{
    FourBitBundle b;
    std::mt19937 rng(23);
    BundleWriter writer(path, {"tiny", "test", "2026-12-06T00:00:00Z", "", {}, {}, kBundleFormatVersion}, b.config);
    writer.addPrompt({"p0", {1, 2, 3, 4, 5, 6}, {7, 8}, std::nullopt, {}});
    EngineSnapshot& s = b.snapshot;
    s.seqLens = {8};
    s.blockTables = {table({{7, 2}}, 2), table({{7, 2}}, 2), table({{7, 2}}, 2)};
    s.keepOnlyReferencedBlocks = keepOnlyReferenced;
    s.ranks.resize(2);
    const std::vector<std::int8_t> signs = kvscopeRhtSigns(32);
    for (int r = 0; r < 2; ++r)
        for (std::size_t l = 0; l < kLayers.size(); ++l) {
            const KvCacheGroup& g = b.config.groups[l];
            s.ranks[std::size_t(r)][kLayers[l]] = {fourBitTensor(g.partDType(KvPart::K), rng, signs),
                                                   fourBitTensor(g.partDType(KvPart::V), rng, signs)};
        }
    writer.addSnapshot("p0", s);
    for (const std::string& layer : kLayers) {
        std::vector<float> zeros(2 * 8 * 32, 0.0f);
        writer.addReference("p0", ReferenceRole::Expected, layer, RawTensor::fromFloat(DType::Float32, {1, 2, 8, 32}, zeros),
                            RawTensor::fromFloat(DType::Float32, {1, 2, 8, 32}, zeros));
    }
    writer.finish();
    return b;
}

}  // namespace

void TestFourBitFormats::bundlesRoundTrip()
{
    QTemporaryDir dir;
    for (bool subset : {false, true}) {
        const std::string path = dir.filePath(subset ? "subset.h5" : "all.h5").toStdString();
        const FourBitBundle w = writeFourBit(path, subset);
        const BundleReader reader(path);
        QCOMPARE(reader.config().toJson(), w.config.toJson());
        QCOMPARE(reader.config().groups[2].partDType(KvPart::V), DType::Float4E2M1);
        QCOMPARE(reader.config().groups[2].partDType(KvPart::K), DType::Float8E4M3);
        QVERIFY(reader.validate().empty());
        for (int r = 0; r < 2; ++r)
            for (const std::string& layer : kLayers)
                for (KvPart part : {KvPart::K, KvPart::V}) {
                    const RawTensor& in = part == KvPart::K ? w.snapshot.ranks[std::size_t(r)].at(layer).first
                                                            : w.snapshot.ranks[std::size_t(r)].at(layer).second;
                    const std::vector<std::int64_t> ids{7, 2};
                    const PagedShard got = reader.readEngineShard("p0", 0, r, layer, part, &ids);
                    QCOMPARE(got.physicalIds, (std::vector<std::int64_t>{2, 7}));
                    QCOMPARE(got.blocks.dtype, in.dtype);
                    QCOMPARE(got.blocks.scale, in.scale);  // NVFP4's global scale, exactly
                    QCOMPARE(got.blocks.rhtSigns, in.rhtSigns);
                    const std::size_t rowBytes = std::size_t(in.stride(0));
                    const std::size_t rowScales = in.scales.size() / 10, rowPoints = in.zeroPoints.size() / 10;
                    for (std::size_t i = 0; i < 2; ++i) {
                        const std::size_t id = std::size_t(got.physicalIds[i]);
                        QVERIFY(std::equal(got.blocks.bytes.begin() + std::ptrdiff_t(i * rowBytes),
                                           got.blocks.bytes.begin() + std::ptrdiff_t((i + 1) * rowBytes),
                                           in.bytes.begin() + std::ptrdiff_t(id * rowBytes)));
                        for (std::size_t j = 0; j < rowScales; ++j)  // (float equality: e4m3 values decoded from their bits)
                            QVERIFY(sameFloat(got.blocks.scales[i * rowScales + j], in.scales[id * rowScales + j]));
                        for (std::size_t j = 0; j < rowPoints; ++j)
                            QCOMPARE(got.blocks.zeroPoints[i * rowPoints + j], in.zeroPoints[id * rowPoints + j]);
                    }
                }
        // The block scales are stored as e4m3 bits, the zero points as uint8, the signs once per layer.
        const hid_t file = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
        const std::string at = "/prompts/p0/engine/snapshot_0/rank_0/";
        for (const std::string& name : {kLayers[0] + "/k_scale", kLayers[1] + "/k_zero_point", kLayers[1] + "/rht_signs"}) {
            const hid_t d = H5Dopen2(file, (at + name).c_str(), H5P_DEFAULT);
            QVERIFY2(d >= 0, name.c_str());
            const hid_t type = H5Dget_type(d);
            QCOMPARE(H5Tget_size(type), std::size_t(1));
            QCOMPARE(H5Tget_sign(type), name.ends_with("rht_signs") ? H5T_SGN_2 : H5T_SGN_NONE);
            H5Tclose(type);
            H5Dclose(d);
        }
        H5Fclose(file);
    }
}

void TestFourBitFormats::damagedBundleNamesTheDataset()
{
    QTemporaryDir dir;
    const std::string path = dir.filePath("damaged.h5").toStdString();
    writeFourBit(path, false);
    const std::string at = "/prompts/p0/engine/snapshot_0/rank_1/";
    const hid_t file = H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
    H5Ldelete(file, (at + kLayers[1] + "/rht_signs").c_str(), H5P_DEFAULT);
    H5Ldelete(file, (at + kLayers[0] + "/v_scale").c_str(), H5P_DEFAULT);
    H5Fclose(file);
    const BundleReader reader(path);
    expectBundleError([&] { reader.readEngineShard("p0", 0, 1, kLayers[1], KvPart::K); },
                      {path, at + kLayers[1] + "/rht_signs", "missing"});
    expectBundleError([&] { reader.readEngineShard("p0", 0, 1, kLayers[0], KvPart::V); },
                      {path, at + kLayers[0] + "/v_scale", "missing", "e4m3 block scales"});
    const std::vector<std::string> problems = reader.validate();
    QCOMPARE(problems.size(), std::size_t(3));  // (K and V both need the signs)
    QVERIFY2(problems[0].find(kLayers[0] + "/v_scale: missing") != std::string::npos, problems[0].c_str());
    QVERIFY2(problems[1].find(kLayers[1] + "/rht_signs: missing") != std::string::npos, problems[1].c_str());
}

void TestFourBitFormats::configValidatesTheFormats()
{
    const auto config = [](const std::string& dtype, int headSize) {
        return configJson(4, 1, 1, headSize, {{{"layers.0"}, "FullAttentionSpec", 4}}, dtype);
    };
    expectBundleError([&] { KvCacheConfig::fromJson(config("nvfp4", 24)); }, {"groups[0].dtype", "multiple of 16"});
    expectBundleError([&] { KvCacheConfig::fromJson(config("int4_per_token_head", 48)); }, {"groups[0].dtype", "power of two"});
    std::string mixed = config("torch.bfloat16", 40);
    mixed.replace(mixed.find("\"dtype\""), 0, "\"v_dtype\": \"nvfp4\", ");
    expectBundleError([&] { KvCacheConfig::fromJson(mixed); }, {"groups[0].v_dtype", "multiple of 16"});
    std::string unknown = config("torch.bfloat16", 32);
    unknown.replace(unknown.find("\"dtype\""), 0, "\"v_dtype\": \"fp5\", ");
    expectBundleError([&] { KvCacheConfig::fromJson(unknown); }, {"groups[0].v_dtype", "unsupported dtype 'fp5'"});
    std::string ok = config("torch.bfloat16", 32);
    ok.replace(ok.find("\"dtype\""), 0, "\"v_dtype\": \"nvfp4\", ");
    const KvCacheConfig cfg = KvCacheConfig::fromJson(ok);
    QCOMPARE(cfg.groups[0].partDType(KvPart::K), DType::BFloat16);
    QCOMPARE(cfg.groups[0].partDType(KvPart::V), DType::Float4E2M1);
    QVERIFY(cfg.groups[0].quantised());
    QCOMPARE(cfg.groups[0].layerDType(), DType::Float4E2M1);
    QVERIFY(describeGroup(cfg.groups[0]).find("K bfloat16 / V nvfp4") != std::string::npos);
    QCOMPARE(KvCacheConfig::fromJson(cfg.toJson()).groups[0].partDType(KvPart::V), DType::Float4E2M1);
}

QTEST_GUILESS_MAIN(TestFourBitFormats)
#include "tst_four_bit_formats.moc"
