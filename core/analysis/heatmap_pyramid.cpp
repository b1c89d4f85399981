#include "analysis/heatmap_pyramid.h"

#include <algorithm>
#include <cmath>

namespace kvscope {

HeatmapPyramid::HeatmapPyramid(HeatmapGrid full, bool lowerWorse)
    : m_lowerWorse(lowerWorse)
{
    m_levels.push_back(std::move(full));
    while (m_levels.back().columns > 1)
        m_levels.push_back(poolRuns(m_levels.back(), 0, m_levels.back().columns, 2, lowerWorse));
}

HeatmapGrid HeatmapPyramid::window(std::int64_t from, std::int64_t to, std::int64_t maxColumns) const
{
    if (empty())
        return {};
    const HeatmapGrid& full = m_levels.front();
    from = std::clamp<std::int64_t>(from, 0, full.columns - 1);
    to = std::clamp<std::int64_t>(to, from + 1, full.columns);
    maxColumns = std::max<std::int64_t>(maxColumns, 1);
    const std::int64_t perColumn = (to - from + maxColumns - 1) / maxColumns;  // tokens a shown column needs
    int k = 0;
    while (k + 1 < levels() && (std::int64_t(2) << k) <= perColumn)
        ++k;
    const std::int64_t width = std::int64_t(1) << k;
    const HeatmapGrid& coarse = m_levels[std::size_t(k)];
    // Whole runs of `width` tokens, the shown runs a multiple of it from a multiple of their width.
    const std::int64_t run = (perColumn + width - 1) / width;  // coarse columns a shown column
    const std::int64_t first = from / width / run * run;
    const std::int64_t shown = ((to + width - 1) / width - first + run - 1) / run;  // whole runs, the last too
    const std::int64_t last = std::min(coarse.columns, first + shown * run);
    return poolRuns(coarse, first, last, run, m_lowerWorse);
}

}  // namespace kvscope
