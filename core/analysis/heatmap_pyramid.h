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

class HeatmapPyramid {
public:
    HeatmapPyramid() = default;
    // `full`: one column per token (tokensPerColumn 1, firstToken 0).
    HeatmapPyramid(HeatmapGrid full, bool lowerWorse);

    bool empty() const { return m_levels.empty() || m_levels.front().rows == 0 || m_levels.front().columns == 0; }
    const HeatmapGrid& full() const { return m_levels.front(); }
    int levels() const { return int(m_levels.size()); }
    const HeatmapGrid& level(int k) const { return m_levels[std::size_t(k)]; }

    // Tokens [from, to) in at most `maxColumns` columns, each the worst of its run of tokens:
    // poolColumns of the coarsest copy whose columns hold no more tokens than a shown column
    // needs. Runs start at multiples of their width (the view's first column may begin before
    // `from`), so that a column holds the same tokens wherever the view is panned.
    HeatmapGrid window(std::int64_t from, std::int64_t to, std::int64_t maxColumns) const;

private:
    std::vector<HeatmapGrid> m_levels;  // level k: 2^k tokens a column
    bool m_lowerWorse = false;
};

}  // namespace kvscope
