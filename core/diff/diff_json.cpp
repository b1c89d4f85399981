#include "diff/diff_json.h"

#include "analysis/analysis_fields.h"
#include "util/json_writer.h"

namespace kvscope {

namespace {

void writeCell(JsonWriter& w, const CellMove& c, const DiffResult& d)
{
    w.beginObject().field("layer", d.layerNamesB[std::size_t(c.layer)]);
    if (c.token < 0) {  // a broad shift: the layer only
        w.key("prompt").null().key("token").null().key("part").null().key("a").null().key("b").null().endObject();
        return;
    }
    w.field("prompt", c.prompt)
        .field("token", c.token)
        .field("part", d.partNames[std::size_t(c.part)])
        .field("a", c.a)
        .field("b", c.b)
        .endObject();
}

void writePart(JsonWriter& w, const LayerDiff& l, KvPart part)
{
    const std::size_t p = std::size_t(part);
    w.beginObject()
        .field("a", l.statA[p])
        .field("b", l.statB[p])
        .field("noise", l.noise[p])
        .field("change", changeName(l.change[p]))
        .field("cells", l.cells[p])
        .field("worse_cells", l.worseCells[p])
        .field("better_cells", l.betterCells[p])
        .endObject();
}

void writeLayer(JsonWriter& w, const LayerDiff& l, const DiffResult& d)
{
    w.beginObject().field("layer", l.name).field("change", changeName(l.verdict())).key("k");
    writePart(w, l, KvPart::K);
    w.key("v");
    writePart(w, l, KvPart::V);
    w.key("first_worse_cell");
    if (l.firstWorse)
        writeCell(w, *l.firstWorse, d);
    else
        w.null();
    w.endObject();
}

}  // namespace

void writeDiffJson(const DiffResult& d, std::ostream& out)
{
    JsonWriter w(out);
    w.beginObject()
        .field("format", "kvscope-diff")
        .field("format_version", 1)
        .key("a")
        .beginObject()
        .field("path", d.pathA)
        .field("kind", d.aFromAnalysisJson ? "analysis" : "bundle")
        .endObject()
        .key("b")
        .beginObject()
        .field("path", d.pathB)
        .field("kind", "bundle")
        .field("reference_from_a", d.referenceFromA)
        .endObject()
        .field("statistic", diffStatName(d.options.stat))
        .field("max_worse", d.options.maxWorse)
        .field("mode", d.threeWay ? "three-way" : "two-way")
        .field("verdict", changeName(d.verdict()))
        .field("worse_layers", d.count(Change::Worse))
        .field("better_layers", d.count(Change::Better))
        .key("prompts")
        .beginObject()
        .key("matched")
        .array(d.matched.size(), [&](std::size_t i) {
            w.beginObject().field("a", d.matched[i].first).field("b", d.matched[i].second).endObject();
        })
        .key("only_a")
        .strings(d.onlyA)
        .key("only_b")
        .strings(d.onlyB)
        .endObject()
        .key("layers_only_a")
        .strings(d.layersOnlyA)
        .key("layers_only_b")
        .strings(d.layersOnlyB);
    // The regressions first, in model order; then every layer.
    w.key("regressions").beginArray();
    for (const LayerDiff& l : d.layers)
        if (l.verdict() == Change::Worse)
            writeLayer(w, l, d);
    w.endArray().key("first_worse");
    if (d.firstWorse)
        writeCell(w, *d.firstWorse, d);
    else
        w.null();
    writeSuspectsJson(w.key("suspects"), d.suspects);
    w.key("worst_cells").array(d.worstMoves.size(), [&](std::size_t i) { writeCell(w, d.worstMoves[i], d); });
    w.key("layers").array(d.layers.size(), [&](std::size_t i) { writeLayer(w, d.layers[i], d); });
    w.endObject();
    out << "\n";
}

}  // namespace kvscope
