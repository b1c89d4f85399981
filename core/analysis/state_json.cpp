#include "analysis/state_json.h"

namespace kvscope {

void writeStates(JsonWriter& w, const std::vector<StateLayerAnalysis>& states)
{
    w.array(states.size(), [&](std::size_t i) {
        const StateLayerAnalysis& a = states[i];
        w.beginObject().field("layer", a.layer).field("kind", a.kind).field("model_index", a.modelIndex);
        if (!a.problem.empty()) {
            w.field("problem", a.problem).endObject();
            return;
        }
        w.field("three_way", a.threeWay)
            .field("unit_roundoff", a.unitRoundoff)
            .field("off_threshold", a.offThreshold)
            .key("positions").numbers(a.positions)
            .key("uncompared").numbers(a.uncompared);
        w.key("parts").array(a.parts.size(), [&](std::size_t p) {
            const StatePartAnalysis& part = a.parts[p];
            const std::size_t checkpoints = a.positions.size(), cells = std::size_t(part.units);
            w.beginObject()
                .field("name", part.name)
                .field("cells", part.units)
                .field("units_per_cell", part.unitsPerCell)
                .field("engine_dtype", dtypeName(part.engineDType));
            // [checkpoint][cell]
            w.key("rel_l2").floatRows(part.relL2.data(), checkpoints, cells);
            w.key("rel_linf").floatRows(part.relLinf.data(), checkpoints, cells);
            w.key("one_minus_cos").floatRows(part.oneMinusCos.data(), checkpoints, cells);
            if (a.threeWay)
                w.key("base_rel_l2").floatRows(part.baseRelL2.data(), checkpoints, cells);
            w.key("floor").floatRows(part.floor.data(), checkpoints, cells);
            w.key("ratio").floatRows(part.ratio.data(), checkpoints, cells);
            w.key("size_ratio").floatRows(part.sizeRatio.data(), checkpoints, cells);
            w.endObject();
        });
        w.key("non_finite").array(a.nonFinite.size(), [&](std::size_t n) {
            const StateNonFinite& v = a.nonFinite[n];
            w.beginObject().field("part", v.part).field("position", v.position).field("unit", v.unit).field("side", v.side).endObject();
        });
        w.key("replica_differences").array(a.replicaDifferences.size(), [&](std::size_t n) {
            const StateReplicaDifference& d = a.replicaDifferences[n];
            w.beginObject()
                .field("part", d.part)
                .field("rank", d.rank)
                .field("against_rank", d.againstRank)
                .field("unit", d.unit)
                .field("position", d.position)
                .field("units", d.units)
                .field("text", d.describe())
                .endObject();
        });
        w.endObject();
    });
}

}  // namespace kvscope
