#pragma once
// The map a results file keeps at every zoom (docs/results-files.md), so that a viewer shows a
// prompt's map at once and reads only what is on screen: for each map the file keeps (each
// metric's K and V map, reduced by the max over heads), the levels of its pyramid
// (analysis/heatmap_pyramid.h: level k holds the worst of each run of 2^k tokens, with its
// head) from one token a column up to the first level of at most kStoredMapTopColumns
// columns; and, for the error maps, the colour range the data gives (map_spec.h: dataRange).

#include "analysis/heatmap_grid.h"
#include "analysis/map_spec.h"
#include "results/analysis_record.h"

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace kvscope {

class Hdf5File;

inline constexpr std::int64_t kStoredMapTopColumns = 1024;  // about a screen: coarser views pool from it

// The maps kept for a prompt: the error metrics (both ways), the error ratio and the BCs
// (three-way; the BCs when they were computed), each for K and V, max over heads.
std::vector<HeatmapSpec> storedMapSpecs(const PromptAnalysis& p, const RecordedOptions& options);
// How many levels a map of `tokens` keeps: 0 .. the first of at most kStoredMapTopColumns columns.
int storedMapLevels(std::int64_t tokens);
namespace results_path {
// "/prompts/<index>/map/<metric>_<k|v>"; in it "values_<level>" and, for maps per head, "heads_<level>".
std::string map(std::size_t prompt, const HeatmapSpec& spec);
}  // namespace results_path

// Writing: the datasets of every kept map of prompt `index`, then a layer's rows of every level,
// then the colour ranges (from the whole prompt, once it is analysed).
void createStoredMaps(Hdf5File& file, std::size_t index, const PromptAnalysis& p, const RecordedOptions& options);
void writeStoredMapLayer(Hdf5File& file, std::size_t index, const PromptAnalysis& p, const RecordedOptions& options,
                         int layer);
void writeStoredMapRanges(Hdf5File& file, std::size_t index, const PromptAnalysis& p, const RecordedOptions& options);

// Reading: one kept map, a window at a time.
class StoredMap {
public:
    // Prompt `index`'s map for `spec` in the results file `path`, if the file keeps it (not
    // for the mean over heads or one head: those are built from the per-head arrays). Throws
    // BundleError naming the dataset when the file's map is damaged.
    static std::optional<StoredMap> open(const std::string& path, std::size_t index, const HeatmapSpec& spec,
                                         int layers, std::int64_t tokens);

    int rows() const { return m_rows; }
    std::int64_t tokens() const { return m_tokens; }
    // The colour range the data gives, linear or logarithmic (error maps; the others' is fixed).
    std::optional<ValueRange> dataRange(bool logarithmic) const;
    // The error-in-floors map's off threshold, every layer's (three-way), as the suspects took it;
    // none in a file written before it was kept.
    std::optional<double> offThreshold() const { return m_offThreshold; }
    // Tokens [from, to) in at most `maxColumns` columns, as HeatmapPyramid::window gives them:
    // reads only the columns of the level it pools from.
    HeatmapGrid window(std::int64_t from, std::int64_t to, std::int64_t maxColumns) const;

private:
    std::shared_ptr<Hdf5File> m_file;
    std::string m_group;
    int m_rows = 0;
    std::int64_t m_tokens = 0;
    int m_levels = 0;
    bool m_perHead = false;
    bool m_lowerWorse = false;
    std::optional<ValueRange> m_range, m_logRange;
    std::optional<double> m_offThreshold;
};

}  // namespace kvscope
