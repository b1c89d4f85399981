#include "metrics/error_histogram.h"

#include <cmath>
#include <stdexcept>
#include <vector>

namespace kvscope {

HeadErrorHistogram headErrorHistogram(const CaptureLoader& loader, const std::string& promptId,
                                      const std::string& layer, int head, KvPart part, std::int64_t tokenBegin,
                                      std::int64_t tokenEnd, int bins)
{
    const PromptInfo& info = loader.reader().prompt(promptId);
    const bool threeWay = info.hasBaseline;
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
    auto held = [&](std::int64_t t) {
        return reference.present[std::size_t(t)] && actual.present[std::size_t(t)] &&
               (!base || base->present[std::size_t(t)]);
    };
    ErrorRange range;  // of the float32 errors, as they are binned
    HeadErrorHistogram out;
    for (std::int64_t t = tokenBegin; t < tokenEnd; ++t) {
        if (!held(t))
            continue;
        ++out.tokensUsed;
        for (int d = 0; d < reference.headDim; ++d) {
            range.add(std::fabs(at(reference, t)[d] - at(actual, t)[d]));
            if (base)
                range.add(std::fabs(at(reference, t)[d] - at(*base, t)[d]));
        }
    }
    const SharedBins shared(range, bins);
    out.lo = shared.lo();
    out.hi = shared.hi();
    out.bins = bins;
    out.actual = Histogram(bins);
    if (base)
        out.base = Histogram(bins);
    std::vector<float> actualErrors, baseErrors;
    for (std::int64_t t = tokenBegin; t < tokenEnd; ++t) {
        if (!held(t))
            continue;
        for (int d = 0; d < reference.headDim; ++d) {
            actualErrors.push_back(std::fabs(at(reference, t)[d] - at(actual, t)[d]));
            if (base)
                baseErrors.push_back(std::fabs(at(reference, t)[d] - at(*base, t)[d]));
        }
    }
    shared.add(actualErrors.data(), actualErrors.size(), out.actual);
    if (base)
        shared.add(baseErrors.data(), baseErrors.size(), *out.base);
    if (base && out.tokensUsed > 0)
        out.bc = float(bhattacharyya(*out.base, out.actual));
    return out;
}

}  // namespace kvscope
