#include "format/int4_rht.h"

#include "format/hadamard.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>

namespace kvscope {

namespace {

constexpr float kMinScale = 1e-6f;

// H_d (x * s), each value rounded once to float.
void rotate(const float* x, int d, const std::int8_t* signs, float* out)
{
    thread_local std::vector<double> work;
    work.resize(std::size_t(d));
    for (int i = 0; i < d; ++i)
        work[std::size_t(i)] = double(x[i]) * signs[i];
    walshHadamard(work.data(), d);
    for (int i = 0; i < d; ++i)
        out[i] = float(work[std::size_t(i)]);
}

std::uint8_t codeOf(float rotated, float scale, float zeroPoint)
{
    return floatToUInt4(rotated / scale + zeroPoint);
}

}  // namespace

Int4RhtRow int4RhtQuantise(const float* x, int d, const std::int8_t* signs, std::uint8_t* codes)
{
    thread_local std::vector<float> rotated;
    rotated.resize(std::size_t(d));
    rotate(x, d, signs, rotated.data());
    const auto [lo, hi] = std::minmax_element(rotated.begin(), rotated.end());
    Int4RhtRow row;
    row.scale = std::max((*hi - *lo) / 15.0f, kMinScale);
    row.zeroPoint = floatToUInt4(-*lo / row.scale);
    for (int i = 0; i < d; ++i)
        codes[i] = codeOf(rotated[std::size_t(i)], row.scale, float(row.zeroPoint));
    return row;
}

void int4RhtDecode(const std::uint8_t* codes, int d, float scale, int zeroPoint, const std::int8_t* signs, float* out)
{
    thread_local std::vector<double> work;
    work.resize(std::size_t(d));
    for (int i = 0; i < d; ++i)
        work[std::size_t(i)] = double(int(codes[i]) - zeroPoint) * double(scale);
    walshHadamard(work.data(), d);
    for (int i = 0; i < d; ++i)
        out[i] = float(work[std::size_t(i)] / d * signs[i]);
}

void int4RhtRequantise(const float* x, int d, float scale, int zeroPoint, const std::int8_t* signs, float* out)
{
    thread_local std::vector<float> rotated;
    thread_local std::vector<std::uint8_t> codes;
    rotated.resize(std::size_t(d));
    codes.resize(std::size_t(d));
    rotate(x, d, signs, rotated.data());
    for (int i = 0; i < d; ++i)
        codes[std::size_t(i)] = scale > 0 ? codeOf(rotated[std::size_t(i)], scale, float(zeroPoint)) : std::uint8_t(zeroPoint);
    int4RhtDecode(codes.data(), d, scale, zeroPoint, signs, out);
}

std::vector<std::int8_t> kvscopeRhtSigns(int d)
{
    std::vector<std::int8_t> signs(std::size_t(std::max(d, 0)));
    std::uint64_t state = 0x9E3779B9u, draw = 0;
    for (std::size_t i = 0; i < signs.size(); ++i) {
        if (i % 64 == 0) {  // SplitMix64
            std::uint64_t z = (state += 0x9E3779B97F4A7C15ull);
            z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
            z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
            draw = z ^ (z >> 31);
        }
        signs[i] = (draw >> (i % 64)) & 1u ? std::int8_t(-1) : std::int8_t(1);
    }
    return signs;
}

RawTensor int4RhtTensor(std::vector<std::int64_t> shape, const std::vector<float>& values, std::vector<std::int8_t> signs)
{
    if (shape.size() != 4 || !isPowerOfTwo(int(shape[3])) || std::int64_t(signs.size()) != shape[3])
        throw std::invalid_argument("int4_per_token_head needs [blocks, heads, block_size, head_dim] with head_dim a power "
                                    "of two and as many signs, got " + shapeToString(shape) + " and " +
                                    std::to_string(signs.size()) + " signs");
    RawTensor t;
    t.dtype = DType::Int4TokenHead;
    t.shape = std::move(shape);
    const int d = int(t.shape[3]);
    const std::size_t rows = values.size() / std::size_t(d);
    t.bytes.resize(values.size());
    std::vector<float> scales(rows);
    t.zeroPoints.resize(rows);
    for (std::size_t r = 0; r < rows; ++r) {
        const Int4RhtRow row = int4RhtQuantise(values.data() + r * std::size_t(d), d, signs.data(),
                                               t.bytes.data() + r * std::size_t(d));
        scales[r] = row.scale;
        t.zeroPoints[r] = row.zeroPoint;
    }
    t.setScales(ScaleGranularity::TokenHead, std::move(scales));
    t.rhtSigns = std::move(signs);
    return t;
}

}  // namespace kvscope
