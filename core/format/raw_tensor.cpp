#include "format/raw_tensor.h"

#include "format/int4_rht.h"

#include <algorithm>
#include <limits>

namespace kvscope {

std::int64_t RawTensor::numel() const
{
    std::int64_t n = 1;
    for (std::int64_t d : shape)
        n *= d;
    return n;
}

std::int64_t RawTensor::stride(int dim) const
{
    std::int64_t s = 1;
    for (std::size_t i = std::size_t(dim) + 1; i < shape.size(); ++i)
        s *= shape[i];
    return s;
}

const char* granularityName(ScaleGranularity granularity)
{
    switch (granularity) {
    case ScaleGranularity::Tensor: return "tensor";
    case ScaleGranularity::Head: return "head";
    case ScaleGranularity::TokenHead: return "token_head";
    case ScaleGranularity::TokenGroup: return "token_group";
    }
    return "?";
}

ScaleGranularity RawTensor::granularity() const
{
    if (scales.empty())
        return ScaleGranularity::Tensor;
    if (shape.size() == 4 && elementsPerScale == shape[3])
        return ScaleGranularity::TokenHead;
    return shape.size() == 4 && elementsPerScale < shape[3] ? ScaleGranularity::TokenGroup : ScaleGranularity::Head;
}

void RawTensor::setScales(ScaleGranularity granularity, std::vector<float> values)
{
    scale = 1.0f;
    scales = std::move(values);
    elementsPerScale = 0;
    if (granularity == ScaleGranularity::Tensor || shape.size() != 4)
        return;
    switch (granularity) {
    case ScaleGranularity::Head: elementsPerScale = shape[2] * shape[3]; break;
    case ScaleGranularity::TokenHead: elementsPerScale = shape[3]; break;
    case ScaleGranularity::TokenGroup: {
        const std::int64_t rows = shape[0] * shape[1] * shape[2];
        const std::int64_t groups = rows > 0 ? std::int64_t(scales.size()) / rows : 1;
        elementsPerScale = groups > 0 ? shape[3] / groups : shape[3];
        break;
    }
    case ScaleGranularity::Tensor: break;
    }
}

std::vector<std::int64_t> RawTensor::scalesShape() const
{
    if (dtype == DType::Float4E2M1 && !scales.empty() && shape.size() == 4)
        return {shape[0], shape[1], shape[2], shape[3] / elementsPerScale};
    switch (granularity()) {
    case ScaleGranularity::Tensor: return {};
    case ScaleGranularity::Head: return {shape[1]};
    case ScaleGranularity::TokenHead: return {shape[0], shape[1], shape[2]};
    case ScaleGranularity::TokenGroup: return {shape[0], shape[1], shape[2], shape[3] / elementsPerScale};
    }
    return {};
}

void RawTensor::decode(std::int64_t offset, std::int64_t count, float* dst) const
{
    const std::int64_t size = std::int64_t(dtypeSize(dtype));
    if (dtype == DType::Int4TokenHead) {
        decodeInt4Rows(offset, count, dst);
        return;
    }
    if (scales.empty()) {
        decodeToFloat(dtype, bytes.data() + offset * size, std::size_t(count), dst, scale);
        return;
    }
    // One decode per run of elements sharing a scale.
    for (std::int64_t done = 0; done < count;) {
        const std::int64_t e = offset + done;
        const std::int64_t run = std::min(count - done, elementsPerScale - e % elementsPerScale);
        decodeToFloat(dtype, bytes.data() + e * size, std::size_t(run), dst + done, scaleAt(e));
        if (scale != 1.0f)  // NVFP4's global scale, after the block's (whose product is exact)
            for (std::int64_t i = 0; i < run; ++i)
                dst[done + i] *= scale;
        done += run;
    }
}

void RawTensor::decodeInt4Rows(std::int64_t offset, std::int64_t count, float* dst) const
{
    const std::int64_t d = shape.empty() ? 0 : shape.back();
    if (d <= 0 || std::int64_t(rhtSigns.size()) != d || scales.empty()) {  // not decodable: NaN, never a guess
        std::fill_n(dst, count, std::numeric_limits<float>::quiet_NaN());
        return;
    }
    thread_local std::vector<float> row;
    row.resize(std::size_t(d));
    for (std::int64_t done = 0; done < count;) {
        const std::int64_t e = offset + done, first = e - e % d;
        const std::int64_t run = std::min(count - done, first + d - e);
        float* out = run == d ? dst + done : row.data();
        int4RhtDecode(bytes.data() + first, int(d), scaleAt(first), zeroPointAt(first), rhtSigns.data(), out);
        if (out == row.data())
            std::copy_n(row.data() + (e - first), run, dst + done);
        done += run;
    }
}

std::vector<float> RawTensor::toFloat() const
{
    std::vector<float> out(static_cast<std::size_t>(numel()));
    decode(0, numel(), out.data());
    return out;
}

RawTensor RawTensor::fromFloat(DType dtype, std::vector<std::int64_t> shape,
                               const std::vector<float>& values, float scale)
{
    RawTensor t;
    t.dtype = dtype;
    t.shape = std::move(shape);
    t.scale = scale;
    t.bytes.resize(values.size() * dtypeSize(dtype));
    encodeFromFloat(dtype, values.data(), values.size(), t.bytes.data(), scale);
    return t;
}

RawTensor RawTensor::fromFloat(DType dtype, std::vector<std::int64_t> shape, const std::vector<float>& values,
                               ScaleGranularity granularity, std::vector<float> scales)
{
    RawTensor t;
    t.dtype = dtype;
    t.shape = std::move(shape);
    t.setScales(granularity, std::move(scales));
    const std::size_t size = dtypeSize(dtype);
    t.bytes.resize(values.size() * size);
    for (std::size_t i = 0; i < values.size(); ++i) {
        const float s = t.scaleAt(std::int64_t(i));
        const float v = s > 0.0f ? values[i] : 0.0f;
        encodeFromFloat(dtype, &v, 1, t.bytes.data() + i * size, s > 0.0f ? s : 1.0f);
    }
    return t;
}

std::string shapeToString(const std::vector<std::int64_t>& shape)
{
    std::string s = "[";
    for (std::size_t i = 0; i < shape.size(); ++i)
        s += (i ? ", " : "") + std::to_string(shape[i]);
    return s + "]";
}

}  // namespace kvscope
