#include "diff/diff_side.h"

#include "analysis/threshold_check.h"
#include "format/bundle_error.h"
#include "format/json_fields.h"
#include "results/analysis_input.h"
#include "results/results_file.h"

#include <nlohmann/json.hpp>

#include <cmath>
#include <fstream>
#include <sstream>

namespace kvscope {

namespace {

using Json = JsonFields::Json;

DiffPrompt diffPromptOf(const PromptAnalysis& p)
{
    DiffPrompt d;
    d.id = p.id;
    d.inputIds = p.inputIds;
    d.promptLen = p.promptLen;
    d.tokens = p.tokens;
    d.threeWay = p.threeWay;
    d.referenceHashes = p.referenceHashes;
    d.layers = p.layers;
    d.ratios = cellRatioMaxima(p);
    return d;
}

}  // namespace

DiffSide diffSideOf(const AnalysisResult& result)
{
    DiffSide side;
    side.path = result.bundle;
    for (const PromptAnalysis& p : result.prompts)
        side.prompts.push_back(diffPromptOf(p));
    return side;
}

DiffSide loadDiffSide(const std::string& path, const AnalysisOptions& options)
{
    std::ifstream file(path, std::ios::binary);
    char c = 0;
    while (file.get(c) && (c == ' ' || c == '\n' || c == '\r' || c == '\t')) {
    }
    if (file && c == '{')
        return readDiffSide(path);
    AnalysisInput input = analysisForVerdict(path, options);  // a bundle, or a results file
    DiffSide side = diffSideOf(input.result);
    if ((side.fromAnalysisJson = input.fromResultsFile))
        side.path = path;
    else
        side.bundle = std::move(input.reader);
    return side;
}

DiffSide readDiffSide(const std::string& jsonPath)
{
    const JsonFields f(jsonPath);
    std::ifstream file(jsonPath, std::ios::binary);
    if (!file)
        f.fail("", "cannot be opened");
    Json doc = Json::parse(file, nullptr, false);
    if (doc.is_discarded())
        f.fail("", "is not valid JSON");
    if (!doc.is_object() || !doc.contains("format") || doc["format"] != "kvscope-analysis")
        f.fail("format", "is not \"kvscope-analysis\": not an analysis written by kvscope analyze --json");
    DiffSide side;
    side.path = jsonPath;
    side.fromAnalysisJson = true;
    if (doc.contains("problems") && doc["problems"].is_array() && !doc["problems"].empty())
        f.fail("problems", "the analysis could not analyse every prompt (" + doc["problems"][0].dump() +
                               "): it cannot stand for A");
    const Json& prompts = f.at(doc, "prompts", "");
    if (!prompts.is_array())
        f.fail("prompts", "must be an array");
    for (std::size_t i = 0; i < prompts.size(); ++i) {
        const Json& p = prompts[i];
        const std::string where = "prompts[" + std::to_string(i) + "].";
        DiffPrompt d;
        d.id = f.text(p, "id", where);
        for (const char* needed : {"input_ids", "reference_fingerprints", "error_ratios"})
            if (!p.contains(needed))
                f.fail(where + needed, "missing: this analysis was written by a kvscope older than diff; run kvscope "
                                       "analyze --json again");
        // Strict, as a bundle given for A is analysed: what the analysis could not read is not a pass.
        if (p.contains("problems") && p["problems"].is_array() && !p["problems"].empty())
            f.fail(where + "problems", "the analysis could not read everything of this prompt (" +
                                           p["problems"][0].dump() + "): it cannot stand for A");
        for (const Json& id : f.at(p, "input_ids", where)) {
            if (!id.is_number_integer())
                f.fail(where + "input_ids", "must hold integers");
            d.inputIds.push_back(id.get<std::int64_t>());
        }
        d.promptLen = f.integer(p, "prompt_len", where);
        d.tokens = f.integer(p, "num_tokens", where);
        if (d.tokens < 0 || d.tokens > (std::int64_t(1) << 24))
            f.fail(where + "num_tokens", "outside 0..2^24");
        d.threeWay = f.text(p, "mode", where) == "three-way";
        for (const Json& name : f.at(p, "layer_names", where)) {
            if (!name.is_string())
                f.fail(where + "layer_names", "must hold strings");
            d.layers.push_back(name.get<std::string>());
        }
        const Json& fingerprints = f.at(p, "reference_fingerprints", where);
        for (std::size_t role = 0; role < 2; ++role) {
            const char* name = role ? "baseline" : "expected";
            const std::string field = where + "reference_fingerprints." + name;
            const Json& list = f.at(fingerprints, name, where + "reference_fingerprints.");
            if (list.is_null() && (role == 1 && !d.threeWay)) {
                d.referenceHashes[role].assign(d.layers.size(), 0);
                continue;
            }
            if (!list.is_array() || list.size() != d.layers.size())
                f.fail(field, "must hold one fingerprint per layer (" + std::to_string(d.layers.size()) + ")");
            for (std::size_t l = 0; l < list.size(); ++l)
                d.referenceHashes[role].push_back(f.fingerprint(list[l], field + "[" + std::to_string(l) + "]"));
        }
        const Json& ratios = f.at(p, "error_ratios", where);
        d.ratios[0] = f.layerRows(f.at(ratios, "k", where + "error_ratios."), d.layers.size(), d.tokens, where + "error_ratios.k");
        d.ratios[1] = f.layerRows(f.at(ratios, "v", where + "error_ratios."), d.layers.size(), d.tokens, where + "error_ratios.v");
        side.prompts.push_back(std::move(d));
    }
    return side;
}

}  // namespace kvscope
