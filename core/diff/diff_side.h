#pragma once
// One side of kvscope diff: per prompt what the comparison needs (its tokens, the fingerprints
// of its reference, and each cell's ratio in floors), from an analysis just run or read back
// from its JSON (kvscope analyze --json), so that a CI job can keep last week's analysis
// instead of last week's capture.

#include "analysis/analysis_result.h"
#include "analysis/analyzer.h"
#include "analysis/off_floor.h"

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace kvscope {

struct DiffPrompt {
    std::string id;
    std::vector<std::int64_t> inputIds;
    std::int64_t promptLen = 0;
    std::int64_t tokens = 0;
    bool threeWay = false;
    std::array<std::vector<std::uint64_t>, 2> referenceHashes;  // [expected, baseline][layer] (util/content_hash.h)
    std::vector<std::string> layers;
    CellRatioMaxima ratios;  // [K/V][layer * tokens + token], in floors

    float ratio(KvPart part, int layer, std::int64_t token) const
    {
        return ratios[std::size_t(part)][std::size_t(layer) * std::size_t(tokens) + std::size_t(token)];
    }
};

struct DiffSide {
    std::string path;
    bool fromAnalysisJson = false;  // an analysis (JSON or results file), not a capture
    // A capture's bundle (its metadata only): the reference an engine-only B borrows.
    std::shared_ptr<const BundleReader> bundle;
    std::vector<DiffPrompt> prompts;
};

DiffSide diffSideOf(const AnalysisResult& result);
// An analysis JSON document (docs/analysis-json.md); BundleError naming the file and the field
// when it is not one, or predates what diff needs.
DiffSide readDiffSide(const std::string& jsonPath);
// A's side as kvscope diff and report --against take it: an analysis JSON (a file starting with
// '{'), a results file, or a bundle analysed strictly (as check does) with `options`.
DiffSide loadDiffSide(const std::string& path, const AnalysisOptions& options);

}  // namespace kvscope
