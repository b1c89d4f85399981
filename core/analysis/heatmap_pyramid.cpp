#include "analysis/heatmap_pyramid.h"

#include <algorithm>
#include <cmath>

namespace kvscope {

namespace {

// Columns [first, last) of `grid` in runs of `run`: the worst defined value of each, with its head.
HeatmapGrid poolRuns(const HeatmapGrid& grid, std::int64_t first, std::int64_t last, std::int64_t run, bool lowerWorse)
{
    HeatmapGrid out;
    out.rows = grid.rows;
    out.columns = (last - first + run - 1) / run;
    out.firstToken = grid.firstToken + first * grid.tokensPerColumn;
    out.tokensPerColumn = grid.tokensPerColumn * run;
    out.values.assign(std::size_t(out.rows) * std::size_t(out.columns), std::nanf(""));
    out.heads.assign(out.values.size(), -1);
    for (int r = 0; r < grid.rows; ++r)
        for (std::int64_t c = 0; c < out.columns; ++c) {
            const std::size_t at = std::size_t(r) * std::size_t(out.columns) + std::size_t(c);
            for (std::int64_t k = first + c * run; k < std::min(last, first + (c + 1) * run); ++k) {
                const float v = grid.at(r, k);
                if (!std::isnan(v) && (std::isnan(out.values[at]) || (lowerWorse ? v < out.values[at] : v > out.values[at]))) {
                    out.values[at] = v;
                    out.heads[at] = grid.headAt(r, k);
                }
            }
        }
    return out;
}

}  // namespace

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
