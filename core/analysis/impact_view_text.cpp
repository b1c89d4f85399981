#include "analysis/impact_view_text.h"

namespace kvscope {

namespace {

// "KL up to 0.0029 nats (median 0.00065), top-1 changed at 4 of 40 steps"
std::string rowText(const ImpactFigures& f)
{
    return "KL up to " + klText(f.klMax) + " nats (median " + klText(f.klMedian) + "), top-1 changed at " +
           std::to_string(f.top1Changed) + " of " + std::to_string(f.steps) + " steps";
}

}  // namespace

std::optional<double> noiseRatio(const std::optional<ImpactFigures>& figures, const std::optional<ImpactFigures>& noise)
{
    if (!figures || !noise || !(noise->klMax > 0))
        return std::nullopt;
    return figures->klMax / noise->klMax;
}

std::string noiseRatioText(const std::optional<ImpactFigures>& figures, const std::optional<ImpactFigures>& noise)
{
    const std::optional<double> ratio = noiseRatio(figures, noise);
    return ratio ? ratioText(*ratio) + "x" : "-";
}

std::string impactShortText(const SuspectImpact& impact)
{
    std::string text = "output: " + std::to_string(impact.engine.top1Changed) + "/" + std::to_string(impact.engine.steps) +
                       " steps changed, KL \u2264 " + klText(impact.engine.klMax);
    if (noiseRatio(impact.engine, impact.noise))
        text += " (" + noiseRatioText(impact.engine, impact.noise) + " noise)";
    return text;
}

ImpactLevel impactLevel(const LayerImpact& layer)
{
    if (!layer.alone)
        return ImpactLevel::None;
    if (!layer.aloneNoise)
        return ImpactLevel::NoNoise;
    // (noise 0: any KL at all is beyond it)
    return layer.alone->klMax > kImpactNoiseFactor * layer.aloneNoise->klMax ? ImpactLevel::AboveNoise
                                                                              : ImpactLevel::WithinNoise;
}

std::vector<std::string> layerImpactLines(const LayerImpact& layer)
{
    std::vector<std::string> lines;
    if (layer.alone)
        lines.push_back("the engine's KV in this layer alone: " + rowText(*layer.alone));
    if (layer.aloneNoise)
        lines.push_back("the baseline's KV in it (bf16 noise): " + rowText(*layer.aloneNoise));
    if (noiseRatio(layer.alone, layer.aloneNoise))
        lines.push_back("alone: " + noiseRatioText(layer.alone, layer.aloneNoise) + " the noise");
    if (layer.from)
        lines.push_back("the engine's KV from this layer on: " + rowText(*layer.from));
    if (layer.fromNoise)
        lines.push_back("the baseline's KV from it on (bf16 noise): " + rowText(*layer.fromNoise));
    if (noiseRatio(layer.from, layer.fromNoise))
        lines.push_back("from it on: " + noiseRatioText(layer.from, layer.fromNoise) + " the noise");
    return lines;
}

}  // namespace kvscope
