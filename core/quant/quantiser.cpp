#include "quant/quantiser.h"

#include "format/int4_rht.h"
#include "format/minifloat.h"
#include "format/nvfp4.h"
#include "util/simd_clones.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <functional>
#include <vector>

namespace kvscope {

namespace {

using Format = QuantScheme::Format;
using Scaling = QuantScheme::Scaling;

// The largest value of a symmetric format's grid.
float largestOf(Format f)
{
    switch (f) {
    case Format::Fp8E4M3: return kE4M3Fn.largest;
    case Format::Fp8E5M2: return kE5M2.largest;
    case Format::Int8: return 127.0f;
    default: return 1.0f;
    }
}

// `q` on a float format's grid, saturated, without branches (so that the loops vectorise):
// the normal path rounds float's mantissa to the format's (ties to even, a carry moving into
// the exponent), the subnormal path adds and takes away 2^23 steps (float's own rounding to
// nearest even at one step); the magnitude picks one. The same results as roundToMinifloat
// for finite values (tests/core/format/tst_dtype.cpp checks every bf16 pattern).
inline float onFloatGrid(const Minifloat& f, float q)
{
    const float magnitude = std::fabs(q);
    const int drop = 23 - f.mantissaBits;
    std::uint32_t bits = std::bit_cast<std::uint32_t>(magnitude);
    bits += (1u << (drop - 1)) - 1 + ((bits >> drop) & 1u);
    bits &= ~((1u << drop) - 1);
    const float normal = std::bit_cast<float>(bits);
    const float shift = f.tiniest * 8388608.0f;  // 2^23 steps
    const float subnormal = (magnitude + shift) - shift;
    const float rounded = std::min(magnitude < f.normal ? subnormal : normal, f.largest);
    return std::copysign(rounded, q);
}

// x[0..n) on the format's grid with `scale` (0: every value kept as it is), saturated; counts
// the values clipped.
KVSCOPE_VECTOR_CLONES
void symmetric(Format f, const float* x, float* out, std::size_t n, float scale, std::int64_t& saturated)
{
    if (!(scale > 0)) {
        std::copy_n(x, n, out);
        return;
    }
    const float largest = largestOf(f);
    const float limit = largest * (1.0f + 1e-6f);  // not amax / (amax / largest)'s rounding
    std::int64_t clipped = 0;
    if (f == Format::Int8) {
#pragma omp simd reduction(+ : clipped)
        for (std::size_t i = 0; i < n; ++i) {
            const float q = x[i] / scale;
            clipped += std::fabs(q) > limit;
            out[i] = std::nearbyint(std::clamp(q, -largest, largest)) * scale;
        }
    } else {
        const Minifloat& grid = f == Format::Fp8E4M3 ? kE4M3Fn : kE5M2;
#pragma omp simd reduction(+ : clipped)
        for (std::size_t i = 0; i < n; ++i) {
            const float q = x[i] / scale;
            clipped += std::fabs(q) > limit;
            out[i] = onFloatGrid(grid, q) * scale;
        }
    }
    saturated += clipped;
}

// Asymmetric int4 (a scale and a zero point from the group's min and max).
void asymmetricInt4(const float* x, float* out, std::size_t n, std::size_t stride, std::int64_t& saturated)
{
    float lo = x[0], hi = x[0];
    for (std::size_t i = 1; i < n; ++i)
        lo = std::min(lo, x[i * stride]), hi = std::max(hi, x[i * stride]);
    const float scale = (hi - lo) / 15.0f;
    if (!(scale > 0)) {
        for (std::size_t i = 0; i < n; ++i)
            out[i * stride] = x[i * stride];
        return;
    }
    const float zero = std::nearbyint(-lo / scale);
    for (std::size_t i = 0; i < n; ++i) {
        const float q = std::nearbyint(x[i * stride] / scale) + zero;
        if (q < 0 || q > 15)
            ++saturated;
        out[i * stride] = (std::clamp(q, 0.0f, 15.0f) - zero) * scale;
    }
}

float amaxOf(const float* x, std::size_t n, std::size_t stride = 1)
{
    float m = 0;
    for (std::size_t i = 0; i < n; ++i)
        m = std::max(m, std::fabs(x[i * stride]));
    return m;
}

}  // namespace

namespace {

// The rows of `positions` (present tokens), each `row` values of `heads` heads of `dim`.
struct Rows {
    const QuantiseInput& in;
    const std::vector<std::int64_t>& positions;
    std::size_t dim, heads, row;
    std::size_t at(std::int64_t t) const { return std::size_t(t) * row; }
};

// KIVI: K per channel over groups of tokens, V per token in groups of values; the last
// `residual` tokens kept in full precision (its recent window).
void kivi(const QuantScheme& s, const Rows& r, float* out, std::int64_t& sat)
{
    const QuantiseInput& in = r.in;
    const std::vector<std::int64_t>& positions = r.positions;
    const std::size_t kept = std::min(positions.size(), std::size_t(s.residual));
    const std::size_t quantised = positions.size() - kept;
    for (std::size_t i = quantised; i < positions.size(); ++i)
        std::copy_n(in.values + r.at(positions[i]), r.row, out + r.at(positions[i]));
    if (in.isK) {
        // K per channel: each (head, channel) over groups of `group` tokens.
        std::vector<float> column, result;
        for (std::size_t first = 0; first < quantised; first += std::size_t(s.group)) {
            const std::size_t n = std::min<std::size_t>(std::size_t(s.group), quantised - first);
            for (std::size_t c = 0; c < r.row; ++c) {
                column.resize(n);
                result.resize(n);
                for (std::size_t i = 0; i < n; ++i)
                    column[i] = in.values[r.at(positions[first + i]) + c];
                asymmetricInt4(column.data(), result.data(), n, 1, sat);
                for (std::size_t i = 0; i < n; ++i)
                    out[r.at(positions[first + i]) + c] = result[i];
            }
        }
        return;
    }
    for (std::size_t i = 0; i < quantised; ++i)
        for (std::size_t h = 0; h < r.heads; ++h)
            for (std::size_t g = 0; g < r.dim; g += std::size_t(s.group)) {
                const std::size_t at = r.at(positions[i]) + h * r.dim + g;
                asymmetricInt4(in.values + at, out + at, std::min<std::size_t>(std::size_t(s.group), r.dim - g), 1, sat);
            }
}

// NVFP4: one fp32 global scale per tensor so that every block's scale fits e4m3, then an e4m3
// scale per 16 values of a head, then e2m1 values, as vLLM's kernel computes them
// (format/nvfp4.h); decoded code x block scale x global.
void nvfp4Blocks(const Rows& r, float* out, std::int64_t& sat)
{
    const QuantiseInput& in = r.in;
    float amax = 0;
    for (std::int64_t t : r.positions)
        amax = std::max(amax, amaxOf(in.values + r.at(t), r.row));
    if (!(amax > 0)) {
        for (std::int64_t t : r.positions)
            std::copy_n(in.values + r.at(t), r.row, out + r.at(t));
        return;
    }
    const float global = nvfp4GlobalScale(amax);
    std::uint8_t codes[kNvfp4Block];
    for (std::int64_t t : r.positions)
        for (std::size_t h = 0; h < r.heads; ++h)
            for (std::size_t b = 0; b < r.dim; b += kNvfp4Block) {
                const int n = int(std::min<std::size_t>(kNvfp4Block, r.dim - b));
                const float* x = in.values + r.at(t) + h * r.dim + b;
                float* o = out + r.at(t) + h * r.dim + b;
                const float blockScale = fp8e4m3ToFloat(nvfp4QuantiseBlock(x, n, global, codes));
                for (int i = 0; i < n; ++i) {
                    if (blockScale > 0 && std::fabs(x[i] * (1.0f / global) / blockScale) > float(kE2M1.maxFinite()))
                        ++sat;
                    o[i] = e2m1ToFloat(codes[i]) * blockScale * global;
                }
            }
}

// vLLM's int4 per token-head: each head row rotated, quantised, decoded and rotated back.
void int4Rht(const Rows& r, float* out)
{
    // vLLM requires a power of two; other widths are padded with zeros (kvscope's choice).
    int d = 1;
    while (d < r.in.dim)
        d *= 2;
    const std::vector<std::int8_t> signs = kvscopeRhtSigns(d);
    const auto width = static_cast<std::size_t>(d);
    std::vector<float> x(width), decoded(width);
    std::vector<std::uint8_t> codes(width);
    for (std::int64_t t : r.positions)
        for (std::size_t h = 0; h < r.heads; ++h) {
            std::fill(x.begin(), x.end(), 0.0f);
            std::copy_n(r.in.values + r.at(t) + h * r.dim, r.dim, x.begin());
            const Int4RhtRow q = int4RhtQuantise(x.data(), d, signs.data(), codes.data());
            int4RhtDecode(codes.data(), d, q.scale, q.zeroPoint, signs.data(), decoded.data());
            std::copy_n(decoded.begin(), r.dim, out + r.at(t) + h * r.dim);
        }
}

}  // namespace

QuantiseStats quantise(const QuantScheme& s, const QuantiseInput& in, float* out)
{
    const std::size_t dim = std::size_t(in.dim), heads = std::size_t(in.heads), row = heads * dim;
    QuantiseStats stats;
    std::vector<std::int64_t> positions;
    for (std::int64_t t = 0; t < in.seq; ++t) {
        const std::size_t at = std::size_t(t) * row;
        if (in.present[std::size_t(t)])
            positions.push_back(t);
        else
            std::copy_n(in.values + at, row, out + at);
    }
    stats.values = std::int64_t(positions.size() * row);
    const auto rowAt = [&](std::int64_t t) { return std::size_t(t) * row; };
    std::int64_t& sat = stats.saturated;

    switch (s.scaling) {
    case Scaling::Tensor:
    case Scaling::VllmStatic: {
        float amax = 0;
        for (std::int64_t t : positions)
            amax = std::max(amax, amaxOf(in.values + rowAt(t), row));
        const float scale = s.scaling == Scaling::Tensor ? amax / largestOf(s.format)
                                                         : in.warmupAmax / (in.isK ? 200.0f : 100.0f);
        for (std::int64_t t : positions)
            symmetric(s.format, in.values + rowAt(t), out + rowAt(t), row, scale, sat);
        break;
    }
    case Scaling::Head:
        for (std::size_t h = 0; h < heads; ++h) {
            float amax = 0;
            for (std::int64_t t : positions)
                amax = std::max(amax, amaxOf(in.values + rowAt(t) + h * dim, dim));
            for (std::int64_t t : positions)
                symmetric(s.format, in.values + rowAt(t) + h * dim, out + rowAt(t) + h * dim, dim,
                          amax / largestOf(s.format), sat);
        }
        break;
    case Scaling::TokenHead:
        for (std::int64_t t : positions)
            for (std::size_t h = 0; h < heads; ++h) {
                const float* x = in.values + rowAt(t) + h * dim;
                symmetric(s.format, x, out + rowAt(t) + h * dim, dim, amaxOf(x, dim) / largestOf(s.format), sat);
            }
        break;
    case Scaling::Group:
        for (std::int64_t t : positions)
            for (std::size_t h = 0; h < heads; ++h)
                for (std::size_t g = 0; g < dim; g += std::size_t(s.group)) {
                    const std::size_t at = rowAt(t) + h * dim + g;
                    asymmetricInt4(in.values + at, out + at, std::min<std::size_t>(std::size_t(s.group), dim - g), 1, sat);
                }
        break;
    case Scaling::Kivi:
        kivi(s, Rows{in, positions, dim, heads, row}, out, sat);
        break;
    case Scaling::Block16:
        nvfp4Blocks(Rows{in, positions, dim, heads, row}, out, sat);
        break;
    case Scaling::TokenHeadRht:
        int4Rht(Rows{in, positions, dim, heads, row}, out);
        break;
    }
    return stats;
}

}  // namespace kvscope
