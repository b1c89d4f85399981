#include "analysis/impact_json.h"

#include <nlohmann/json.hpp>

namespace kvscope {

namespace {

void writeFigures(JsonWriter& w, const std::optional<ImpactFigures>& f)
{
    if (!f) {
        w.null();
        return;
    }
    w.beginObject()
        .field("kl_median", f->klMedian)
        .field("kl_max", f->klMax)
        .field("top1_changed", f->top1Changed)
        .field("steps", f->steps)
        .endObject();
}

std::optional<ImpactFigures> readFigures(const JsonFields& f, const JsonFields::Json& j, const char* key,
                                         const std::string& where)
{
    const JsonFields::Json& v = f.at(j, key, where);
    if (v.is_null())
        return std::nullopt;
    const std::string at = where + key + ".";
    ImpactFigures out;
    out.klMedian = f.number(v, "kl_median", at);
    out.klMax = f.number(v, "kl_max", at);
    out.top1Changed = int(f.integer(v, "top1_changed", at));
    out.steps = int(f.integer(v, "steps", at));
    return out;
}

}  // namespace

void writeSuspectImpact(JsonWriter& w, const std::optional<SuspectImpact>& impact)
{
    if (!impact)
        return;
    w.key("impact").beginObject().field("layer", impact->layer).field("replaced", "this layer and every later attention layer");
    writeFigures(w.key("engine"), impact->engine);
    writeFigures(w.key("noise"), impact->noise);
    writeFigures(w.key("alone"), impact->alone);
    w.key("prompts").strings(impact->prompts).field("text", impact->text).endObject();
}

std::optional<SuspectImpact> readSuspectImpact(const JsonFields& f, const JsonFields::Json& suspect, const std::string& at)
{
    if (!suspect.contains("impact") || suspect.at("impact").is_null())
        return std::nullopt;
    const JsonFields::Json& j = suspect.at("impact");
    const std::string where = at + "impact.";
    SuspectImpact out;
    out.layer = f.text(j, "layer", where);
    const std::optional<ImpactFigures> engine = readFigures(f, j, "engine", where);
    if (!engine)
        f.fail(where + "engine", "must be an object");
    out.engine = *engine;
    out.noise = readFigures(f, j, "noise", where);
    out.alone = readFigures(f, j, "alone", where);
    out.prompts = f.texts(j, "prompts", where);
    out.text = f.text(j, "text", where);
    return out;
}

void writePromptImpact(JsonWriter& w, const ImpactRecord& record)
{
    const std::size_t steps = std::size_t(record.steps);
    w.beginObject().field("computed_by", record.computedBy).field("steps", record.steps);
    w.key("rows").array(record.transplants.size(), [&](std::size_t t) {
        w.beginObject().key("transplant").value(nlohmann::json::parse(transplantJson(record.transplants[t])));
        w.key("kl").beginArray();
        for (std::size_t g = 0; g < steps; ++g)
            w.value(record.kl[t * steps + g]);
        w.endArray().key("top1_changed").beginArray();
        for (std::size_t g = 0; g < steps; ++g)
            w.value(int(record.top1Changed[t * steps + g]));
        w.endArray().endObject();
    });
    w.endObject();
}

}  // namespace kvscope
