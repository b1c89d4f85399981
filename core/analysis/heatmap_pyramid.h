#pragma once
// A heatmap at every zoom: the full grid and coarser copies of it, each pooling pairs of the
// previous one's columns (the worst value of the pair, with its head). A view of any token
// range then pools at most about twice as many columns as it shows, from the copy whose
// columns are just narrower than its own: panning and zooming cost what is on screen, not
// what the prompt holds (a 128k-token map is as quick as a 1k-token one).

#include "analysis/heatmap_grid.h"

#include <cstdint>
#include <vector>

namespace kvscope {

// Where a window of tokens [from, to), shown in at most `maxColumns` columns, comes from: the
// coarsest level (of `levels`, level k holding 2^k tokens a column) whose columns hold no
// more tokens than a shown column needs, and its columns [first, last) pooled in runs of
// `run`. Runs start at multiples of their width (the view's first column may begin before
// `from`), so that a column holds the same tokens wherever the view is panned. The in-memory
// pyramid and the one stored in a results file (results/stored_map.h) share it.
struct PyramidWindow {
    int level = 0;
    std::int64_t first = 0, last = 0, run = 1;
};
PyramidWindow planPyramidWindow(std::int64_t tokens, int levels, std::int64_t from, std::int64_t to,
                                std::int64_t maxColumns);
// The columns of level k of a `tokens`-token map.
inline std::int64_t pyramidLevelColumns(std::int64_t tokens, int level)
{
    return (tokens + (std::int64_t(1) << level) - 1) >> level;
}

class HeatmapPyramid {
public:
    HeatmapPyramid() = default;
    // `full`: one column per token (tokensPerColumn 1, firstToken 0).
    HeatmapPyramid(HeatmapGrid full, bool lowerWorse);

    bool empty() const { return m_levels.empty() || m_levels.front().rows == 0 || m_levels.front().columns == 0; }
    const HeatmapGrid& full() const { return m_levels.front(); }
    int levels() const { return int(m_levels.size()); }
    const HeatmapGrid& level(int k) const { return m_levels[std::size_t(k)]; }

    // Tokens [from, to) in at most `maxColumns` columns, each the worst of its run of tokens
    // (planPyramidWindow).
    HeatmapGrid window(std::int64_t from, std::int64_t to, std::int64_t maxColumns) const;

private:
    std::vector<HeatmapGrid> m_levels;  // level k: 2^k tokens a column
    bool m_lowerWorse = false;
};

}  // namespace kvscope
