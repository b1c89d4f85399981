#include "diff/diff_side.h"

#include "analysis/analysis_fields.h"
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

// What diff needs of a prompt's shape (analysis/analysis_fields.h's, however it was read).
DiffPrompt diffPromptShape(const PromptAnalysis& p)
{
    DiffPrompt d;
    d.id = p.id;
    d.inputIds = p.inputIds;
    d.promptLen = p.promptLen;
    d.tokens = p.tokens;
    d.threeWay = p.threeWay;
    d.referenceHashes = p.referenceHashes;
    d.layers = p.layers;
    return d;
}

DiffPrompt diffPromptOf(const PromptAnalysis& p)
{
    DiffPrompt d = diffPromptShape(p);
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
        for (const char* needed : {"input_ids", "reference_fingerprints", "error_ratios"})
            if (!p.contains(needed))
                f.fail(where + needed, "missing: this analysis was written by a kvscope older than diff; run kvscope "
                                       "analyze --json again");
        // Strict, as a bundle given for A is analysed: what the analysis could not read is not a pass.
        if (p.contains("problems") && p["problems"].is_array() && !p["problems"].empty())
            f.fail(where + "problems", "the analysis could not read everything of this prompt (" +
                                           p["problems"][0].dump() + "): it cannot stand for A");
        PromptAnalysis shape;
        readPromptShape(f, p, where, shape);
        DiffPrompt d = diffPromptShape(shape);
        const Json& ratios = f.at(p, "error_ratios", where);
        d.ratios[0] = f.layerRows(f.at(ratios, "k", where + "error_ratios."), d.layers.size(), d.tokens, where + "error_ratios.k");
        d.ratios[1] = f.layerRows(f.at(ratios, "v", where + "error_ratios."), d.layers.size(), d.tokens, where + "error_ratios.v");
        side.prompts.push_back(std::move(d));
    }
    return side;
}

}  // namespace kvscope
