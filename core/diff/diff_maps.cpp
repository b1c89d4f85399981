#include "diff/diff_maps.h"

#include <cmath>

namespace kvscope {

HeatmapGrid diffHeatmap(const DiffResult& diff, std::size_t prompt, KvPart part, DiffMapKind kind)
{
    const DiffPromptMaps& m = diff.maps[prompt];
    const std::vector<float>& a = m.ratiosA[std::size_t(part)];
    const std::vector<float>& b = m.ratiosB[std::size_t(part)];
    HeatmapGrid grid;
    grid.rows = int(diff.layerNamesB.size());
    grid.columns = m.tokens;
    grid.values.resize(b.size());
    grid.heads.assign(b.size(), -1);  // a cell's ratio is its largest head's; the map does not name it
    for (std::size_t i = 0; i < b.size(); ++i)
        grid.values[i] = kind == DiffMapKind::A ? a[i] : kind == DiffMapKind::B ? b[i]
                         : std::isfinite(a[i]) && std::isfinite(b[i]) ? b[i] - a[i] : std::nanf("");
    return grid;
}

MapSpec diffMapSpec(const KvCacheConfig& configB, const DiffResult& diff, std::size_t prompt, KvPart part,
                    DiffMapKind kind, const PromptAnalysis& promptB, const PromptInfo& infoB)
{
    HeatmapSpec ratio;
    ratio.metric = HeatmapMetric::ErrorRatio;
    ratio.part = part;
    MapSpec s = promptMapSpec(configB, promptB, infoB, ratio);
    const DiffPromptMaps& m = diff.maps[prompt];
    const std::string& partText = diff.partNames[std::size_t(part)];
    const std::string measure = diff.threeWay ? "error ratio (L-inf / noise floor)" : "error ratio (relative L2 / dtype rounding)";
    if (kind == DiffMapKind::Change) {
        s.scale = ScaleKind::Change;
        s.range = defaultRange(ScaleKind::Change);
        s.metricLabel = partText + " " + measure + ", B - A, floors, max over heads";
        s.title = m.b + ": " + partText + " B - A in floors (red: B worse, blue: B better)";
    } else {
        s.scale = ScaleKind::Ratio;
        s.range = defaultRange(ScaleKind::Ratio);
        s.metricLabel = partText + " " + measure + ", max over heads";
        s.title = (kind == DiffMapKind::A ? "A " + m.a : "B " + m.b) + ": " + s.metricLabel;
    }
    return s;
}

}  // namespace kvscope
