#include "analysis/divergence.h"

#include <algorithm>
#include <cmath>

namespace kvscope {

double ulpBound(double value, int nUlps, int mantissaBits)
{
    if (value == 0 || !std::isfinite(value))
        return 0;
    // floor(log2|v|) exactly: ilogb reads the exponent, where log2 is a libm approximation.
    return nUlps * std::ldexp(1.0, std::ilogb(value) - mantissaBits);
}

namespace {

std::int64_t argmax(const Logits& logits, std::int64_t step)
{
    const float* row = logits.values.data() + step * logits.vocab;
    return std::max_element(row, row + logits.vocab) - row;
}

bool hasLogits(const PromptInfo& p, LogitsRole role)
{
    return std::find(p.logits.begin(), p.logits.end(), role) != p.logits.end();
}

}  // namespace

std::vector<Divergence> findDivergences(const CaptureLoader& loader, const PromptInfo& prompt)
{
    std::vector<Divergence> out;
    std::optional<Logits> actual;
    if (hasLogits(prompt, LogitsRole::Actual))
        actual = loader.logits(prompt.id, LogitsRole::Actual);

    std::vector<std::int64_t> teacher = prompt.teacherTokens;
    for (LogitsRole role : {LogitsRole::Baseline, LogitsRole::Expected}) {
        if (!teacher.empty() || !hasLogits(prompt, role))
            continue;
        const Logits ref = loader.logits(prompt.id, role);
        for (std::int64_t g = 0; g < ref.steps; ++g)
            teacher.push_back(argmax(ref, g));
    }

    auto annotate = [&](Divergence& d) {
        const std::int64_t g = d.position - prompt.promptLen;
        if (!actual || g < 0 || g >= actual->steps || g >= std::int64_t(teacher.size()))
            return;
        const std::int64_t engine = argmax(*actual, g);
        const std::int64_t want = teacher[std::size_t(g)];
        if (want < 0 || want >= actual->vocab)
            return;
        const float* row = actual->values.data() + g * actual->vocab;
        d.engineToken = engine;
        d.teacherToken = want;
        d.logitGap = double(row[engine]) - double(row[want]);
        d.ulpBound = ulpBound(row[engine]);
        d.inBounds = *d.logitGap <= *d.ulpBound;
    };

    if (prompt.hasDivergences) {
        for (std::int64_t pos : prompt.divergencePositions) {
            Divergence d;
            d.position = pos;
            annotate(d);
            out.push_back(d);
        }
        return out;
    }
    if (!actual)
        return out;
    const std::int64_t steps = std::min<std::int64_t>(actual->steps, std::int64_t(teacher.size()));
    for (std::int64_t g = 0; g < steps; ++g) {
        if (argmax(*actual, g) == teacher[std::size_t(g)])
            continue;
        Divergence d;
        d.position = prompt.promptLen + g;
        d.derived = true;
        annotate(d);
        out.push_back(d);
    }
    return out;
}

}  // namespace kvscope
