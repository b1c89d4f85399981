#pragma once
// The maps of a diff, for the report and the app: per matched prompt and part, A's error
// ratio, B's, and B minus A, layers (B's) x tokens, in floors. The change map is on a
// diverging scale centred on 0 (red: B worse, blue: B better).

#include "analysis/heatmap_grid.h"
#include "analysis/map_spec.h"
#include "diff/capture_diff.h"

namespace kvscope {

enum class DiffMapKind { A, B, Change };

HeatmapGrid diffHeatmap(const DiffResult& diff, std::size_t prompt, KvPart part, DiffMapKind kind);
// Labelled like B's prompt maps (`promptB`, `infoB`: B's analysis and bundle entry of that prompt).
MapSpec diffMapSpec(const KvCacheConfig& configB, const DiffResult& diff, std::size_t prompt, KvPart part,
                    DiffMapKind kind, const PromptAnalysis& promptB, const PromptInfo& infoB);

}  // namespace kvscope
