#include "analysis/head_error_histogram.h"

#include <cmath>
#include <optional>
#include <stdexcept>

namespace kvscope {

HeadErrorHistogram headErrorHistogram(const CaptureLoader& loader, const std::string& promptId,
                                      const std::string& layer, int head, KvPart part, std::int64_t tokenBegin,
                                      std::int64_t tokenEnd, int bins)
{
    const bool threeWay = loader.prompt(promptId).hasBaseline;
    const LayerKv actual = loader.engineLayer(promptId, layer);
    const LayerKv reference = loader.referenceLayer(promptId, threeWay ? ReferenceRole::Baseline : ReferenceRole::Expected, layer);
    std::optional<LayerKv> base;
    if (threeWay)
        base = loader.referenceLayer(promptId, ReferenceRole::Expected, layer);
    if (head < 0 || head >= reference.heads)
        throw std::invalid_argument("head " + std::to_string(head) + " outside [0, " + std::to_string(reference.heads) + ")");
    if (tokenBegin < 0 || tokenEnd > reference.seq || tokenBegin >= tokenEnd)
        throw std::invalid_argument("token range [" + std::to_string(tokenBegin) + ", " + std::to_string(tokenEnd) +
                                    ") outside [0, " + std::to_string(reference.seq) + ")");

    auto at = [&](const LayerKv& kv, std::int64_t t) { return part == KvPart::K ? kv.kAt(head, t) : kv.vAt(head, t); };
    std::vector<float> actualErrors, baseErrors;
    std::int64_t tokens = 0;
    for (std::int64_t t = tokenBegin; t < tokenEnd; ++t) {
        const std::size_t i = std::size_t(t);
        if (!reference.present[i] || !actual.present[i] || (base && !base->present[i]))
            continue;  // only tokens every side holds
        ++tokens;
        for (int d = 0; d < reference.headDim(part); ++d) {
            actualErrors.push_back(std::fabs(at(reference, t)[d] - at(actual, t)[d]));
            if (base)
                baseErrors.push_back(std::fabs(at(reference, t)[d] - at(*base, t)[d]));
        }
    }
    return errorHistogram(base ? &baseErrors : nullptr, actualErrors, tokens, bins);
}

}  // namespace kvscope
