#include "transfer/transfer_map.h"

#include <algorithm>
#include <cmath>

namespace kvscope {

TransferMap transferMap(const TransferResult& result, std::size_t prompt)
{
    TransferMap m;
    const PromptTransfer& p = result.prompts.at(prompt);
    std::int64_t positions = 0;
    for (const std::vector<PositionRange>* ranges : {&p.positions.transferred, &p.positions.missing, &p.positions.extra, &p.positions.local})
        for (const PositionRange& r : *ranges)
            positions = std::max(positions, r.end);
    HeatmapGrid& g = m.grid;
    g.rows = int(result.layers.size());
    g.columns = std::max<std::int64_t>(positions, 1);
    g.values.assign(std::size_t(g.rows) * std::size_t(g.columns), std::nanf(""));
    g.heads.assign(g.values.size(), -1);
    for (int row = 0; row < g.rows; ++row)
        for (const PositionRange& r : p.positions.transferred)
            std::fill_n(g.values.begin() + std::ptrdiff_t(std::size_t(row) * std::size_t(g.columns) + std::size_t(r.begin)),
                        r.end - r.begin, kTransferIdentical);
    for (const BlockFinding& f : result.changed) {
        if (f.block.prompt != prompt)
            continue;
        const float value = f.explanation.explained() ? kTransferExplained : kTransferUnexplained;
        for (std::int64_t position : f.block.changedPositions)
            if (position >= 0 && position < g.columns) {
                const std::size_t at = f.block.layer * std::size_t(g.columns) + std::size_t(position);
                g.values[at] = value;
                g.heads[at] = f.block.heads.empty() ? -1 : std::int16_t(f.block.heads.front());
            }
    }

    MapSpec& s = m.spec;
    s.title = p.consumer + ": the consumer's KV against the producer's (" + p.producer + ")";
    s.metricLabel = "transferred KV";
    s.xName = s.xLabel = "position";
    s.scale = ScaleKind::Transfer;
    s.range = defaultRange(ScaleKind::Transfer);
    for (const TransferLayer& layer : result.layers) {
        s.rowLabels.push_back(shortLayerName(layer.name));  // as the prompt page's rows say it
        s.layerNames.push_back(layer.name);
    }
    return m;
}

const BlockFinding* transferFindingAt(const TransferResult& result, std::size_t prompt, std::size_t layer,
                                      std::int64_t position)
{
    for (const BlockFinding& f : result.changed)
        if (f.block.prompt == prompt && f.block.layer == layer &&
            std::find(f.block.comparedPositions.begin(), f.block.comparedPositions.end(), position) !=
                f.block.comparedPositions.end())
            return &f;
    return nullptr;
}

}  // namespace kvscope
