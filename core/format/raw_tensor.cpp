#include "format/raw_tensor.h"

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

void RawTensor::decode(std::int64_t offset, std::int64_t count, float* dst) const
{
    decodeToFloat(dtype, bytes.data() + offset * std::int64_t(dtypeSize(dtype)), std::size_t(count),
                  dst, scale);
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

std::string shapeToString(const std::vector<std::int64_t>& shape)
{
    std::string s = "[";
    for (std::size_t i = 0; i < shape.size(); ++i)
        s += (i ? ", " : "") + std::to_string(shape[i]);
    return s + "]";
}

}  // namespace kvscope
