#include "analysis/state_rows.h"

#include "analysis/map_spec.h"
#include "util/short_number.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>

namespace kvscope {

std::vector<StateRow> stateRows(const PromptAnalysis& p)
{
    std::vector<StateRow> rows;
    for (const StateLayerAnalysis& a : p.states) {  // (in the model's order already)
        StateRow row;
        row.layer = a.layer;
        // "model.layers.12.mixer" -> "model.layers.12 [mamba2]", as the map's rows are labelled
        std::string name = shortLayerName(a.layer);
        if (const std::size_t at = name.rfind("layers."); at != std::string::npos)
            if (const std::size_t dot = name.find('.', at + 7); dot != std::string::npos)
                name.resize(dot);
        row.label = name + (a.kind.rfind("mamba", 0) == 0 ? " [ssm]" : a.kind == "gated_delta_net" ? " [gdn]" : " [state]");
        row.problem = a.problem;
        for (std::size_t c = 0; c < a.positions.size(); ++c)
            row.cells.push_back({a.positions[c] - 1, c, double(a.worstRatio(c)) / a.offThreshold});
        rows.push_back(std::move(row));
    }
    return rows;
}

const StateRowCell* stateCellNear(const StateRow& row, std::int64_t token, std::int64_t reach)
{
    const StateRowCell* nearest = nullptr;
    for (const StateRowCell& cell : row.cells)
        if (std::llabs(cell.token - token) <= reach && (!nearest || std::llabs(cell.token - token) < std::llabs(nearest->token - token)))
            nearest = &cell;
    return nearest;
}

namespace {

// A cell of a part: a head of the SSM state ("head 5"), a run of conv channels ("channels 0-11").
std::string cellName(const StatePartAnalysis& part, std::int64_t cell)
{
    if (part.unitsPerCell == 1)
        return (part.name == "conv" ? "channel " : "unit ") + std::to_string(cell);
    const std::int64_t first = cell * part.unitsPerCell;
    return "channels " + std::to_string(first) + "-" + std::to_string(first + part.unitsPerCell - 1);
}

}  // namespace

std::string stateCellText(const StateLayerAnalysis& a, std::size_t checkpoint)
{
    std::string text = a.layer + ", the state after position " + std::to_string(a.positions.at(checkpoint)) + ": worst " +
                       shortNumber(a.worstRatio(checkpoint)) + " floors (off above " + shortNumber(a.offThreshold) + ")";
    for (const StatePartAnalysis& part : a.parts) {
        std::vector<std::pair<float, std::int64_t>> cells;
        for (std::int64_t u = 0; u < part.units; ++u)
            if (std::isfinite(part.at(part.ratio, checkpoint, u)))
                cells.emplace_back(part.at(part.ratio, checkpoint, u), u);
        std::sort(cells.begin(), cells.end(), [](const auto& x, const auto& y) { return x.first > y.first; });
        std::size_t shown = 0;
        while (shown < cells.size() && shown < 8 && (shown == 0 || cells[shown].first > a.offThreshold))
            ++shown;
        text += "; " + part.name + (part.name == "ssm" ? " heads: " : ": ");
        for (std::size_t i = 0; i < shown; ++i) {
            const std::string name = cellName(part, cells[i].second);
            text += (i ? ", " : "") + (part.name == "ssm" ? std::to_string(cells[i].second) : name) + " (" +
                    shortNumber(cells[i].first) + ")";
        }
        const std::size_t off = std::size_t(std::count_if(cells.begin(), cells.end(), [&](const auto& c) { return c.first > a.offThreshold; }));
        if (off > shown)
            text += " and " + std::to_string(off - shown) + " more off";
        if (off == 0)
            text += " (none off)";
    }
    return text;
}

}  // namespace kvscope
