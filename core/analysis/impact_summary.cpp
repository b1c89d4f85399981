#include "analysis/impact_summary.h"

#include <algorithm>
#include <cstdio>
#include <exception>

namespace kvscope {

namespace {

const PromptAnalysis* findPrompt(const std::vector<PromptAnalysis>& prompts, const std::string& id)
{
    for (const PromptAnalysis& p : prompts)
        if (p.id == id)
            return &p;
    return nullptr;
}

std::vector<std::string> allIds(const std::vector<PromptAnalysis>& prompts)
{
    std::vector<std::string> ids;
    for (const PromptAnalysis& p : prompts)
        ids.push_back(p.id);
    return ids;
}

}  // namespace

void readImpacts(const CaptureLoader& loader, std::vector<PromptAnalysis>& prompts)
{
    if (!loader.holdsData())
        return;
    for (PromptAnalysis& p : prompts) {
        try {
            p.impact = loader.impact(p.id);
        } catch (const std::exception& e) {
            p.problems.push_back(e.what());
        }
    }
}

std::optional<ImpactFigures> impactFigures(const std::vector<PromptAnalysis>& prompts, const std::vector<std::string>& ids,
                                           const Transplant& transplant)
{
    std::vector<const ImpactRecord*> records;
    for (const std::string& id : ids)
        if (const PromptAnalysis* p = findPrompt(prompts, id); p && p->impact)
            records.push_back(&*p->impact);
    return impactFigures(records, transplant);
}

std::string klText(double kl)
{
    char text[32];
    std::snprintf(text, sizeof text, "%.2g", kl);
    return text;
}

std::string ratioText(double ratio)
{
    char text[32];
    std::snprintf(text, sizeof text, ratio >= 10 ? "%.0f" : "%.1f", ratio);
    return text;
}

std::string impactFiguresText(const ImpactFigures& f)
{
    return "changes the next token at " + std::to_string(f.top1Changed) + " of " + std::to_string(f.steps) +
           " decode steps (KL median " + klText(f.klMedian) + ", up to " + klText(f.klMax) + " nats)";
}

void attachImpact(std::vector<Suspect>& suspects, const std::vector<PromptAnalysis>& prompts)
{
    for (Suspect& s : suspects) {
        s.impact.reset();
        if (s.pattern == SuspectPattern::State || s.firstLayer.empty())
            continue;
        const std::vector<std::string> ids = s.prompts.empty() ? allIds(prompts) : s.prompts;
        const std::optional<ImpactFigures> engine = impactFigures(prompts, ids, {TransplantKind::From, s.firstLayer, {}});
        if (!engine)
            continue;
        SuspectImpact impact;
        impact.layer = s.firstLayer;
        impact.engine = *engine;
        impact.noise = impactFigures(prompts, ids, {TransplantKind::BaselineFrom, s.firstLayer, {}});
        impact.alone = impactFigures(prompts, ids, {TransplantKind::Layer, s.firstLayer, {}});
        for (const std::string& id : ids)
            if (const PromptAnalysis* p = findPrompt(prompts, id); p && p->impact)
                impact.prompts.push_back(id);
        impact.text = "With the engine's KV from " + s.firstLayer + " on, the reference model " +
                      impactFiguresText(impact.engine);
        if (impact.noise) {
            impact.text += "; with the baseline's KV there (bf16 noise), at " + std::to_string(impact.noise->top1Changed) +
                           " of " + std::to_string(impact.noise->steps) + " (up to " + klText(impact.noise->klMax) + ")";
            if (impact.noise->klMax > 0)
                impact.text += ": " + ratioText(impact.engine.klMax / impact.noise->klMax) + "x the noise";
        }
        impact.text += ".";
        s.impact = std::move(impact);
    }
}

std::vector<LayerImpact> layerImpacts(const std::vector<PromptAnalysis>& prompts, const std::vector<std::string>& ids,
                                      const std::vector<std::string>& layers)
{
    std::vector<LayerImpact> out;
    for (const std::string& layer : layers) {
        LayerImpact l;
        l.layer = layer;
        l.alone = impactFigures(prompts, ids, {TransplantKind::Layer, layer, {}});
        l.aloneNoise = impactFigures(prompts, ids, {TransplantKind::Baseline, layer, {}});
        l.from = impactFigures(prompts, ids, {TransplantKind::From, layer, {}});
        l.fromNoise = impactFigures(prompts, ids, {TransplantKind::BaselineFrom, layer, {}});
        out.push_back(std::move(l));
    }
    return out;
}

}  // namespace kvscope
