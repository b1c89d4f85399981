#include "analysis/impact_json.h"

#include <nlohmann/json.hpp>

#include <algorithm>

namespace kvscope {

namespace {

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
    writeImpactFigures(w.key("engine"), impact->engine);
    writeImpactFigures(w.key("noise"), impact->noise);
    writeImpactFigures(w.key("alone"), impact->alone);
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

std::optional<ImpactRecord> readPromptImpact(const JsonFields& f, const JsonFields::Json& prompt, const std::string& at)
{
    if (!prompt.contains("impact") || prompt.at("impact").is_null())
        return std::nullopt;
    const JsonFields::Json& j = prompt.at("impact");
    const std::string where = at + "impact.";
    ImpactRecord record;
    record.computedBy = f.text(j, "computed_by", where);
    record.steps = f.integer(j, "steps", where);
    const JsonFields::Json& rows = f.array(j, "rows", where);
    std::vector<std::string> layers;
    for (std::size_t t = 0; t < rows.size(); ++t) {
        const std::string row = where + "rows[" + std::to_string(t) + "].";
        Transplant transplant;
        if (const std::string problem = parseTransplant(f.at(rows[t], "transplant", row).dump(), transplant); !problem.empty())
            f.fail(row + "transplant", problem);
        layers.push_back(transplant.layer);
        record.transplants.push_back(transplant);
        const JsonFields::Json& kl = f.array(rows[t], "kl", row);
        for (const JsonFields::Json& v : kl) {
            if (!v.is_number())
                f.fail(row + "kl", "must hold numbers");
            record.kl.push_back(v.get<double>());
        }
        for (std::int64_t flag : f.integers(rows[t], "top1_changed", row))
            record.top1Changed.push_back(std::int8_t(std::clamp<std::int64_t>(flag, -1, 2)));
    }
    if (const std::string problem = impactRecordProblem(record, layers); !problem.empty())
        f.fail(where, problem);
    return record;
}

}  // namespace kvscope
