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

PyramidWindow planPyramidWindow(std::int64_t tokens, int levels, std::int64_t from, std::int64_t to,
                                std::int64_t maxColumns)
{
    from = std::clamp<std::int64_t>(from, 0, tokens - 1);
    to = std::clamp<std::int64_t>(to, from + 1, tokens);
    maxColumns = std::max<std::int64_t>(maxColumns, 1);
    const std::int64_t perColumn = (to - from + maxColumns - 1) / maxColumns;  // tokens a shown column needs
    PyramidWindow w;
    while (w.level + 1 < levels && (std::int64_t(2) << w.level) <= perColumn)
        ++w.level;
    const std::int64_t width = std::int64_t(1) << w.level;
    // Whole runs of `width` tokens, the shown runs a multiple of it from a multiple of their width.
    w.run = (perColumn + width - 1) / width;  // level columns a shown column
    w.first = from / width / w.run * w.run;
    const std::int64_t shown = ((to + width - 1) / width - w.first + w.run - 1) / w.run;  // whole runs, the last too
    w.last = std::min(pyramidLevelColumns(tokens, w.level), w.first + shown * w.run);
    return w;
}

HeatmapGrid HeatmapPyramid::window(std::int64_t from, std::int64_t to, std::int64_t maxColumns) const
{
    if (empty())
        return {};
    const PyramidWindow w = planPyramidWindow(full().columns, levels(), from, to, maxColumns);
    return poolRuns(m_levels[std::size_t(w.level)], w.first, w.last, w.run, m_lowerWorse);
}

}  // namespace kvscope
