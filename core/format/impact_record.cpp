#include "format/impact_record.h"

#include "format/capture_bundle.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <set>

namespace kvscope {

namespace {

const char* kindName(TransplantKind kind)
{
    switch (kind) {
    case TransplantKind::Layer: return "layer";
    case TransplantKind::From: return "from";
    case TransplantKind::Scheme: return "scheme";
    case TransplantKind::Baseline: return "baseline";
    case TransplantKind::BaselineFrom: return "baseline_from";
    }
    return "layer";
}

std::string rowName(const ImpactRecord& record, std::size_t t)
{
    return "transplant " + std::to_string(t) + " (" + transplantJson(record.transplants[t]) + ")";
}

}  // namespace

std::string impactPath(const std::string& promptId)
{
    return bundle_path::prompt(promptId) + "/impact";
}

std::string transplantJson(const Transplant& transplant)
{
    nlohmann::json j = {{"kind", kindName(transplant.kind)}, {"layer", transplant.layer}};
    if (transplant.kind == TransplantKind::Scheme)
        j["scheme"] = transplant.scheme;
    return j.dump();
}

std::string parseTransplant(const std::string& json, Transplant& out)
{
    const nlohmann::json j = nlohmann::json::parse(json, nullptr, false);
    if (!j.is_object())
        return "is not a JSON object: " + json;
    if (!j.contains("kind") || !j["kind"].is_string())
        return "has no string \"kind\": " + json;
    if (!j.contains("layer") || !j["layer"].is_string() || j["layer"].get<std::string>().empty())
        return "has no string \"layer\": " + json;
    const std::string kind = j["kind"];
    out = {};
    out.layer = j["layer"];
    if (kind == "layer")
        out.kind = TransplantKind::Layer;
    else if (kind == "from")
        out.kind = TransplantKind::From;
    else if (kind == "baseline")
        out.kind = TransplantKind::Baseline;
    else if (kind == "baseline_from")
        out.kind = TransplantKind::BaselineFrom;
    else if (kind == "scheme") {
        out.kind = TransplantKind::Scheme;
        if (!j.contains("scheme") || !j["scheme"].is_string() || j["scheme"].get<std::string>().empty())
            return "is a scheme transplant without a string \"scheme\": " + json;
        out.scheme = j["scheme"];
    } else {
        return "has an unknown kind '" + kind + "' (layer, from, scheme, baseline or baseline_from): " + json;
    }
    for (const auto& [key, value] : j.items())
        if (key != "kind" && key != "layer" && key != "scheme")
            return "has an unknown key '" + key + "': " + json;
    return {};
}

std::optional<std::size_t> ImpactRecord::find(const Transplant& transplant) const
{
    for (std::size_t t = 0; t < transplants.size(); ++t)
        if (transplants[t] == transplant)
            return t;
    return std::nullopt;
}

std::optional<ImpactFigures> impactFigures(const std::vector<const ImpactRecord*>& records, const Transplant& transplant)
{
    std::vector<double> kl;
    ImpactFigures f;
    for (const ImpactRecord* record : records) {
        const std::optional<std::size_t> row = record->find(transplant);
        if (!row)
            continue;
        for (std::int64_t g = 0; g < record->steps; ++g) {
            kl.push_back(record->klAt(*row, g));
            f.top1Changed += record->changedAt(*row, g) ? 1 : 0;
        }
    }
    if (kl.empty())
        return std::nullopt;
    f.steps = int(kl.size());
    std::sort(kl.begin(), kl.end());
    const std::size_t n = kl.size();
    f.klMax = kl.back();
    f.klMedian = n % 2 ? kl[n / 2] : 0.5 * (kl[n / 2 - 1] + kl[n / 2]);
    return f;
}

void writeImpactFigures(JsonWriter& w, const std::optional<ImpactFigures>& f)
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

std::string impactRecordProblem(const ImpactRecord& record, const std::vector<std::string>& layers)
{
    const std::size_t cells = record.transplants.size() * std::size_t(std::max<std::int64_t>(record.steps, 0));
    if (record.steps < 1)
        return "no decode step (kl must be [transplants, steps] with steps >= 1)";
    if (record.kl.size() != cells || record.top1Changed.size() != cells)
        return "kl and top1_changed must both be [" + std::to_string(record.transplants.size()) + ", " +
               std::to_string(record.steps) + "] (one row per transplant)";
    std::set<std::string> seen;
    for (std::size_t t = 0; t < record.transplants.size(); ++t) {
        const Transplant& tr = record.transplants[t];
        if (std::find(layers.begin(), layers.end(), tr.layer) == layers.end())
            return rowName(record, t) + ": layer '" + tr.layer + "' is not in the KV cache config";
        if (!seen.insert(transplantJson(tr)).second)
            return rowName(record, t) + ": listed twice";
        for (std::int64_t g = 0; g < record.steps; ++g) {
            const double kl = record.klAt(t, g);
            if (!std::isfinite(kl) || kl < 0)
                return rowName(record, t) + ", step " + std::to_string(g) + ": KL " + std::to_string(kl) +
                       " (a KL divergence is finite and never negative)";
            const int flag = record.top1Changed[t * std::size_t(record.steps) + std::size_t(g)];
            if (flag != 0 && flag != 1)
                return rowName(record, t) + ", step " + std::to_string(g) + ": top1_changed " + std::to_string(flag) +
                       " (0 or 1)";
        }
    }
    return {};
}

void writeImpact(Hdf5File& file, const std::string& promptId, const ImpactRecord& record)
{
    const std::string path = impactPath(promptId);
    if (file.exists(path))
        file.remove(path);
    file.createGroup(path);
    file.writeStringAttribute(path, "computed_by", record.computedBy);
    if (record.seconds >= 0)
        file.writeDoubleAttribute(path, "seconds", record.seconds);
    std::vector<std::string> rows;
    for (const Transplant& t : record.transplants)
        rows.push_back(transplantJson(t));
    file.writeStrings(path + "/transplants", rows);
    const std::vector<std::int64_t> shape{std::int64_t(record.transplants.size()), record.steps};
    file.writeRaw(path + "/kl", H5T_IEEE_F64LE, shape, record.kl.data());
    file.writeRaw(path + "/top1_changed", H5T_STD_I8LE, shape, record.top1Changed.data());
}

ImpactRecord readImpact(const Hdf5File& file, const std::string& promptId, const std::vector<std::string>& layers)
{
    const std::string path = impactPath(promptId);
    if (!file.isGroup(path))
        file.fail(path, "missing");
    ImpactRecord record;
    if (file.hasAttribute(path, "computed_by"))
        record.computedBy = file.readStringAttribute(path, "computed_by");
    if (file.hasAttribute(path, "seconds"))
        record.seconds = file.readDoubleAttribute(path, "seconds");
    const std::vector<std::string> rows = file.readStrings(path + "/transplants");
    for (std::size_t t = 0; t < rows.size(); ++t) {
        Transplant transplant;
        if (const std::string problem = parseTransplant(rows[t], transplant); !problem.empty())
            file.fail(path + "/transplants", "row " + std::to_string(t) + " " + problem);
        record.transplants.push_back(transplant);
    }
    const std::string klPath = path + "/kl", flagPath = path + "/top1_changed";
    const DatasetInfo kl = file.datasetInfo(klPath), flags = file.datasetInfo(flagPath);
    if (kl.shape.size() != 2 || kl.shape[0] != std::int64_t(rows.size()))
        file.fail(klPath, "must be [transplants, steps] with " + std::to_string(rows.size()) + " transplants");
    if (flags.shape != kl.shape)
        file.fail(flagPath, "must have kl's shape");
    if (kl.typeClass != H5T_FLOAT || kl.typeSize != 8)
        file.fail(klPath, "must hold float64 values");
    if (flags.typeClass != H5T_INTEGER)
        file.fail(flagPath, "must hold integers");
    record.steps = kl.shape[1];
    const std::int64_t cells = Hdf5File::elementCount(kl.shape);
    if (cells < 0 || cells > (std::int64_t(1) << 28))
        file.fail(klPath, "declares an absurd size");
    file.requirePlausibleSize(klPath, std::uint64_t(cells) * kl.typeSize);
    record.kl.resize(std::size_t(cells));
    if (cells > 0)
        file.readRaw(klPath, H5T_NATIVE_DOUBLE, record.kl.data());
    record.top1Changed.resize(std::size_t(cells));
    const std::vector<std::int64_t> values = file.readIntegers(flagPath, cells);
    for (std::size_t i = 0; i < values.size(); ++i)
        record.top1Changed[i] = std::int8_t(std::clamp<std::int64_t>(values[i], -1, 2));
    if (const std::string problem = impactRecordProblem(record, layers); !problem.empty())
        file.fail(path, problem);
    return record;
}

}  // namespace kvscope
