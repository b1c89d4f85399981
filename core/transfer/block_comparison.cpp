#include "transfer/block_comparison.h"

#include "format/minifloat.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>

namespace kvscope {

double halfSmallestStep(DType dtype)
{
    switch (dtype) {
    case DType::BFloat16: return std::ldexp(1.0, -134);  // subnormal bf16 spacing 2^-133
    case DType::Float16: return kFp16.minSubnormal() / 2;
    case DType::Float32: return std::ldexp(1.0, -150);
    case DType::Float8E4M3: return kE4M3Fn.minSubnormal() / 2;
    case DType::Float8E5M2: return kE5M2.minSubnormal() / 2;
    case DType::Float8E4M3Fnuz: return kE4M3Fnuz.minSubnormal() / 2;
    case DType::Float4E2M1: return kE2M1.minSubnormal() / 2;
    case DType::Int8:
    case DType::Int4TokenHead: return 0.5;  // half a code
    }
    return 0;
}

float convertThrough(DType dtype, float value, float scale)
{
    if (!(scale > 0))
        scale = 1;
    return roundToDType(dtype, value / scale) * scale;
}

bool ValueJudge::same(float expected, float actual, float scale) const
{
    if (std::bit_cast<std::uint32_t>(expected) == std::bit_cast<std::uint32_t>(actual))
        return true;
    if (std::isnan(expected) || std::isnan(actual))
        return std::isnan(expected) && std::isnan(actual);
    if (!format)
        return false;
    // Half a step of the format at the value, a hair more for the float arithmetic of scaling.
    const double allowed = unitRoundoff(*format) * std::fabs(double(expected)) +
                           halfSmallestStep(*format) * std::max(double(scale), 1e-30);
    return std::fabs(double(actual) - double(expected)) <= allowed * (1 + 1e-6);
}

bool rowMatches(const float* expected, const LayerBlocks& consumer, std::int64_t position, int head, KvPart part,
                const ValueJudge& judge, float producerScale)
{
    const std::int64_t e = consumer.entryOf(position);
    const int r = int(position % consumer.blockSize);
    const float* actual = consumer.row(part, e, head, r);
    const float scale = std::max(producerScale, consumer.rowScale(part, e, head, r));
    for (int d = 0; d < consumer.dims.of(part); ++d)
        if (!judge.same(expected[d], actual[d], scale))
            return false;
    return true;
}

std::vector<ChangedBlock> compareBlocks(const LayerBlocks& producer, const LayerBlocks& consumer,
                                        const std::vector<std::uint8_t>& compared, const std::array<ValueJudge, 2>& judges)
{
    std::vector<ChangedBlock> changed;
    const std::int64_t bs = consumer.blockSize;
    const std::int64_t n = std::int64_t(compared.size());
    for (std::int64_t e = 0; e * bs < n; ++e) {
        ChangedBlock block;
        block.block = e;
        block.producerBlock = e < producer.entries() ? producer.physical[std::size_t(e)] : -1;
        block.consumerBlock = e < consumer.entries() ? consumer.physical[std::size_t(e)] : -1;
        std::vector<std::uint8_t> headChanged(std::size_t(consumer.heads), 0);
        for (std::int64_t p = e * bs; p < std::min(n, (e + 1) * bs); ++p) {
            if (!compared[std::size_t(p)])
                continue;
            block.comparedPositions.push_back(p);
            bool positionChanged = false;
            const int r = int(p - e * bs);
            for (int h = 0; h < consumer.heads; ++h)
                for (KvPart part : {KvPart::K, KvPart::V}) {
                    const float* want = producer.row(part, e, h, r);
                    const float* got = consumer.row(part, e, h, r);
                    const float scale = std::max(producer.rowScale(part, e, h, r), consumer.rowScale(part, e, h, r));
                    for (int d = 0; d < consumer.dims.of(part); ++d) {
                        if (judges[std::size_t(part)].same(want[d], got[d], scale))
                            continue;
                        if (block.first.position < 0)
                            block.first = {p, h, part};
                        const double diff = std::fabs(double(got[d]) - double(want[d]));
                        block.maxAbsDifference =
                            std::max(block.maxAbsDifference, std::isnan(diff) ? std::numeric_limits<double>::infinity() : diff);
                        positionChanged = true;
                        headChanged[std::size_t(h)] = 1;
                        block.parts[std::size_t(part)] = true;
                    }
                }
            if (positionChanged)
                block.changedPositions.push_back(p);
        }
        if (block.changedPositions.empty())
            continue;
        for (int h = 0; h < consumer.heads; ++h)
            if (headChanged[std::size_t(h)])
                block.heads.push_back(h);
        changed.push_back(std::move(block));
    }
    return changed;
}

}  // namespace kvscope
