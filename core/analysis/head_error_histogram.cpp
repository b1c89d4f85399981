#include "analysis/head_error_histogram.h"

#include "analysis/state_analysis.h"

#include "format/bundle_error.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <stdexcept>

namespace kvscope {

namespace {

// Tokens a read holds: a 128k-token layer is 2 GB with its references; one head of a few
// thousand tokens is what the histogram needs at a time.
constexpr std::int64_t kWindowTokens = 4096;

// Head `head` of `part` at the tokens of `window`, [token][dim]; NaN where absent.
std::vector<float> headValues(const LayerSource& source, KvPart part, int head, PositionRange window)
{
    const std::int64_t n = window.end - window.begin;
    const std::size_t dim = std::size_t(source.headDim(part));
    std::vector<float> all(std::size_t(source.heads) * std::size_t(n) * dim, std::nanf(""));
    source.decodeHeads(part, window.begin, window.end, all.data());
    const auto first = all.begin() + std::ptrdiff_t(std::size_t(head) * std::size_t(n) * dim);
    return {first, first + std::ptrdiff_t(std::size_t(n) * dim)};
}

}  // namespace

HeadErrorHistogram headErrorHistogram(const CaptureLoader& loader, const std::string& promptId,
                                      const std::string& layer, int head, KvPart part, std::int64_t tokenBegin,
                                      std::int64_t tokenEnd, int bins)
{
    const bool threeWay = loader.prompt(promptId).hasBaseline;
    const std::int64_t seq = loader.sequenceLength(promptId);
    if (tokenBegin < 0 || tokenEnd > seq || tokenBegin >= tokenEnd)
        throw std::invalid_argument("token range [" + std::to_string(tokenBegin) + ", " + std::to_string(tokenEnd) +
                                    ") outside [0, " + std::to_string(seq) + ")");
    std::vector<float> actualErrors, baseErrors;
    std::int64_t tokens = 0;
    // A window of tokens at a time: only the blocks and reference positions it holds are read.
    for (std::int64_t begin = tokenBegin; begin < tokenEnd; begin += kWindowTokens) {
        const PositionRange window{begin, std::min(tokenEnd, begin + kWindowTokens)};
        std::vector<std::string> unreadable;  // (blocks marked absent under the loader's policy: no histogram of them)
        const LayerSource actual = loader.engineSource(promptId, layer, &unreadable, window);
        if (!unreadable.empty())
            throw BundleError(loader.outline().path, layer, unreadable.front());
        const LayerSource reference =
            loader.referenceSource(promptId, threeWay ? ReferenceRole::Baseline : ReferenceRole::Expected, layer, window);
        std::optional<LayerSource> base;
        if (threeWay)
            base = loader.referenceSource(promptId, ReferenceRole::Expected, layer, window);
        if (head < 0 || head >= reference.heads)
            throw std::invalid_argument("head " + std::to_string(head) + " outside [0, " + std::to_string(reference.heads) + ")");
        const std::vector<float> r = headValues(reference, part, head, window), a = headValues(actual, part, head, window);
        const std::vector<float> b = base ? headValues(*base, part, head, window) : std::vector<float>{};
        const std::size_t dim = std::size_t(reference.headDim(part));
        for (std::int64_t t = window.begin; t < window.end; ++t) {
            const std::size_t i = std::size_t(t);
            if (!reference.present[i] || !actual.present[i] || (base && !base->present[i]))
                continue;  // only tokens every side holds
            ++tokens;
            const std::size_t row = std::size_t(t - window.begin) * dim;
            for (std::size_t d = 0; d < dim; ++d) {
                actualErrors.push_back(std::fabs(r[row + d] - a[row + d]));
                if (base)
                    baseErrors.push_back(std::fabs(r[row + d] - b[row + d]));
            }
        }
    }
    return errorHistogram(threeWay ? &baseErrors : nullptr, actualErrors, tokens, bins);
}

HeadErrorHistogram stateErrorHistogram(const CaptureLoader& loader, const std::string& promptId, const std::string& layer,
                                       std::int64_t position, const std::string& part, std::int64_t cell, int bins)
{
    LayerState state = loader.layerState(promptId, layer);
    groupSmallUnits(state);  // the analysis's cells
    const auto at = std::find(state.positions.begin(), state.positions.end(), position);
    if (at == state.positions.end())
        throw std::invalid_argument("no compared checkpoint at position " + std::to_string(position));
    const std::size_t checkpoint = std::size_t(at - state.positions.begin());
    const auto values = std::find_if(state.parts.begin(), state.parts.end(), [&](const StatePartValues& p) { return p.name == part; });
    if (values == state.parts.end() || cell < 0 || cell >= values->units())
        throw std::invalid_argument("no cell " + std::to_string(cell) + " of part '" + part + "'");
    const std::size_t n = std::size_t(values->unitSize()), first = (checkpoint * std::size_t(values->units()) + std::size_t(cell)) * n;
    const std::vector<float>& reference = state.hasBaseline ? values->baseline : values->expected;
    std::vector<float> actualErrors, baseErrors;
    for (std::size_t i = first; i < first + n; ++i) {
        actualErrors.push_back(std::fabs(reference[i] - values->engine[i]));
        if (state.hasBaseline)
            baseErrors.push_back(std::fabs(reference[i] - values->expected[i]));
    }
    return errorHistogram(state.hasBaseline ? &baseErrors : nullptr, actualErrors, 1, bins);
}

}  // namespace kvscope
