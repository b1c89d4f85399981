// The impact column beside a layer map: its rows are the map's (through zoom and pan), its
// figures those of a prompt's impact record written in the test and worked by hand, its bars
// in the map's ratio colours beyond 4x the noise and grey within it; hidden without a record.

#include "widgets/color_scales.h"
#include "widgets/heatmap_view.h"
#include "widgets/impact_column.h"

#include <QHBoxLayout>
#include <QtTest>

#include <cmath>

using namespace kvscope;

namespace {

std::string layerName(int l)
{
    return "model.layers." + std::to_string(l) + ".self_attn";
}

// Four layers, four decode steps: layer 0 well beyond its noise, layer 1 within it, layer 2
// without a baseline's row, layer 3 not measured.
PromptAnalysis measuredPrompt()
{
    PromptAnalysis p;
    p.id = "p0";
    for (int l = 0; l < 4; ++l)
        p.layers.push_back(layerName(l));
    ImpactRecord r;
    r.steps = 4;
    const auto row = [&](TransplantKind kind, int layer, std::vector<double> kl, std::vector<std::int8_t> changed) {
        r.transplants.push_back({kind, layerName(layer), {}});
        r.kl.insert(r.kl.end(), kl.begin(), kl.end());
        r.top1Changed.insert(r.top1Changed.end(), changed.begin(), changed.end());
    };
    row(TransplantKind::Layer, 0, {0.001, 0.003, 0.002, 0.0}, {0, 1, 0, 0});
    row(TransplantKind::Baseline, 0, {0.0002, 0.0001, 0.0001, 0.0001}, {0, 0, 0, 0});
    row(TransplantKind::From, 0, {0.01, 0.5, 0.2, 0.1}, {0, 1, 1, 0});
    row(TransplantKind::Layer, 1, {0.0001, 0.0002, 0.00015, 0.00005}, {0, 0, 0, 0});
    row(TransplantKind::Baseline, 1, {0.0001, 0.0001, 0.0001, 0.0001}, {0, 0, 0, 0});
    row(TransplantKind::Layer, 2, {0.05, 0.01, 0.02, 0.03}, {1, 0, 0, 0});
    p.impact = r;
    return p;
}

}  // namespace

class TestImpactColumn : public QObject {
    Q_OBJECT

private slots:
    void barsFollowTheMapsRowsAndSayTheRecord()
    {
        QWidget box;
        auto* layout = new QHBoxLayout(&box);
        layout->setContentsMargins(0, 0, 0, 0);
        layout->setSpacing(0);
        auto* map = new HeatmapView;
        auto* column = new ImpactColumn(map);
        layout->addWidget(map, 1);
        layout->addWidget(column);
        box.resize(900, 400);
        HeatmapGrid grid;
        grid.rows = 4;
        grid.columns = 10;
        grid.values.assign(40, 1.0f);
        grid.heads.assign(40, -1);
        map->setGrid(grid);
        map->resetView(10, 4);
        box.show();
        QVERIFY(QTest::qWaitForWindowExposed(&box));
        QVERIFY(!column->isVisible());

        const PromptAnalysis p = measuredPrompt();
        const std::vector<LayerImpact> layers = layerImpacts({p}, {p.id}, p.layers);
        column->setImpacts(layers);
        QVERIFY(column->isVisible());
        map->replot(QCustomPlot::rpImmediateRefresh);
        QApplication::processEvents();
        // The scale: half the smallest largest KL (layer 1's noise, 1e-4) up to the largest (layer 2's 0.05).
        QCOMPARE(column->lowerKl(), 5e-5);
        QCOMPARE(column->upperKl(), 0.05);

        // Each map row's centre is the column's row there.
        const int offset = map->mapTo(&box, QPoint(0, 0)).y() - column->mapTo(&box, QPoint(0, 0)).y();
        for (int r = 0; r < 4; ++r)
            QCOMPARE(column->rowAt(int(map->yAxis->coordToPixel(r)) + offset), r);
        QCOMPARE(column->rowAt(map->axisRect()->rect().top() + offset - 3), -1);  // above the map's rows

        // Layer 0: largest 0.003, median (0.001 + 0.002) / 2, one change of 4; noise 0.0002, 15x.
        const QString tip = column->describeAt(int(map->yAxis->coordToPixel(0)) + offset);
        QVERIFY2(tip.contains("<b>model.layers.0.self_attn</b>"), qPrintable(tip));
        QVERIFY2(tip.contains("the engine's KV in this layer alone: KL up to 0.003 nats (median 0.0015), top-1 changed at 1 of 4 steps"),
                 qPrintable(tip));
        QVERIFY2(tip.contains("the baseline's KV in it (bf16 noise): KL up to 0.0002 nats (median 0.0001), top-1 changed at 0 of 4 steps"),
                 qPrintable(tip));
        QVERIFY2(tip.contains("alone: 15x the noise"), qPrintable(tip));
        // From it on: 0.5 largest, median (0.1 + 0.2) / 2, two changes.
        QVERIFY2(tip.contains("the engine's KV from this layer on: KL up to 0.5 nats (median 0.15), top-1 changed at 2 of 4 steps"),
                 qPrintable(tip));
        QVERIFY2(column->describeAt(int(map->yAxis->coordToPixel(2)) + offset).contains("no noise to measure it against"),
                 qPrintable(column->describeAt(int(map->yAxis->coordToPixel(2)) + offset)));
        QVERIFY2(column->describeAt(int(map->yAxis->coordToPixel(3)) + offset).contains("no impact measured"),
                 qPrintable(column->describeAt(int(map->yAxis->coordToPixel(3)) + offset)));

        // Colours: 15x the noise is 15 / 4 = 3.75 "off" on the map's ratio scale; layer 1's 2x is grey.
        QCPColorGradient ratio = colorGradient(ScaleKind::Ratio);
        QCOMPARE(ImpactColumn::barColour(layers[0]), QColor::fromRgb(ratio.color(3.75, QCPRange(0.1, 1000), true)));
        QCOMPARE(ImpactColumn::barColour(layers[1]), QColor("#bdbdbd"));
        QVERIFY(ImpactColumn::barColour(layers[2]) != ImpactColumn::barColour(layers[1]));

        // Bars on the log scale from the band's left: layer 0's reaches log(0.003/5e-5) / log(0.05/5e-5) of it.
        const QRectF bar0 = column->barRect(0), bar2 = column->barRect(2);
        const double full = bar2.width();  // layer 2 holds the largest: the whole band
        QVERIFY(std::abs(bar0.width() - full * std::log(60.0) / std::log(1000.0)) < 1.0);
        QVERIFY(column->barRect(3).isEmpty());
        QVERIFY(std::abs(bar0.center().y() - (map->yAxis->coordToPixel(0) + offset)) < 1.0);

        // Zoomed in on rows 2-3: the rows follow, row 0 leaves the band.
        map->yAxis->setRange(1.5, 3.5);
        map->replot(QCustomPlot::rpImmediateRefresh);
        QCOMPARE(column->rowAt(int(map->yAxis->coordToPixel(2)) + offset), 2);
        QVERIFY(std::abs(column->barRect(2).center().y() - (map->yAxis->coordToPixel(2) + offset)) < 1.0);
        QVERIFY(column->barRect(0).bottom() < map->axisRect()->rect().top() + offset + 1);

        // No record: hidden.
        PromptAnalysis none = p;
        none.impact.reset();
        column->setImpacts(layerImpacts({none}, {none.id}, none.layers));
        QVERIFY(!column->isVisible());
    }
};

QTEST_MAIN(TestImpactColumn)
#include "tst_impact_column.moc"
