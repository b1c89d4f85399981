// The map widget: the colour mapping it draws with (the scales' stops, their interpolation, and
// absent cells left transparent), and its labels at the sizes a 1024x700 screen leaves it: row
// labels and token text never closer than one line / one label's width, pinned rows kept.

#include "widgets/color_scales.h"
#include "widgets/heatmap_view.h"
#include "widgets/provenance_strip.h"

#include <QApplication>
#include <QFontMetrics>
#include <QVBoxLayout>
#include <QtTest>

#include <cmath>

using namespace kvscope;

class TestHeatmapView : public QObject {
    Q_OBJECT

private slots:
    void gradientsHitTheirStopsAndBlendLinearly();
    void absentCellsAreTransparent();
    void rowLabelsNeverOverlapAtSmallSizes();
    void pinnedRowsKeepTheirLabels();
    void tokenTextNeverRunsTogether();
    void transferCellsTakeTheirBand();
    void provenanceStripFollowsTheMap();
};

namespace {

QColor at(QCPColorGradient g, double position)
{
    return QColor::fromRgba(g.color(position, QCPRange(0, 1)));
}

// Pixel positions of the ticks of a text ticker, in order.
QList<double> tickPixels(const QCPAxis* axis)
{
    const auto ticker = qSharedPointerCast<QCPAxisTickerText>(axis->ticker());
    QList<double> pixels;
    for (auto it = ticker->ticks().cbegin(); it != ticker->ticks().cend(); ++it)
        pixels << axis->coordToPixel(it.key());
    std::sort(pixels.begin(), pixels.end());
    return pixels;
}

double closest(const QList<double>& pixels)
{
    double gap = 1e9;
    for (int i = 1; i < pixels.size(); ++i)
        gap = std::min(gap, pixels[i] - pixels[i - 1]);
    return gap;
}

QStringList layerLabels(int n)
{
    QStringList labels;
    for (int i = 0; i < n; ++i)
        labels << QString("model.layers.%1 [%2]").arg(i).arg(i % 2 ? "full" : "sliding 4096");
    return labels;
}

}  // namespace

void TestHeatmapView::gradientsHitTheirStopsAndBlendLinearly()
{
    // The gradient is drawn in 350 levels: a colour may be that of a position up to one level
    // (1/349 of the scale) away, which on a steep stretch moves a channel by its slope / 349.
    const auto near = [](int got, double want, double slope) { return std::abs(got - want) <= slope / 349 + 1.0; };
    for (ScaleKind kind : {ScaleKind::Error, ScaleKind::Ratio, ScaleKind::Bc, ScaleKind::Change, ScaleKind::Transfer}) {
        QCPColorGradient g = colorGradient(kind);
        const std::vector<ColorStop>& stops = colorStops(kind);
        QVERIFY(stops.size() >= 2);
        const auto slope = [&](std::size_t i, int Rgb::*channel) {  // the steeper side of stop i, per unit
            double s = 0;
            for (std::size_t j : {i, i + 1})
                if (j >= 1 && j < stops.size() && stops[j].at > stops[j - 1].at)
                    s = std::max(s, std::abs(stops[j].color.*channel - stops[j - 1].color.*channel) /
                                        (stops[j].at - stops[j - 1].at));
            return s;
        };
        for (std::size_t i = 0; i < stops.size(); ++i) {
            const QColor c = at(g, stops[i].at);
            QVERIFY2(near(c.red(), stops[i].color.r, slope(i, &Rgb::r)) && near(c.green(), stops[i].color.g, slope(i, &Rgb::g)) &&
                         near(c.blue(), stops[i].color.b, slope(i, &Rgb::b)),
                     qPrintable(QString("%1 stop %2").arg(scaleName(kind)).arg(i)));
            if (i + 1 == stops.size() || stops[i + 1].at <= stops[i].at)
                continue;
            // Halfway between two stops: the mean of their RGB values (ciRGB), worked out here.
            const QColor m = at(g, (stops[i].at + stops[i + 1].at) / 2);
            const double width = stops[i + 1].at - stops[i].at;
            const auto halfway = [&](int got, int Rgb::*channel) {
                const double a = stops[i].color.*channel, b = stops[i + 1].color.*channel;
                return near(got, (a + b) / 2, std::abs(b - a) / width);
            };
            QVERIFY2(halfway(m.red(), &Rgb::r) && halfway(m.green(), &Rgb::g) && halfway(m.blue(), &Rgb::b),
                     qPrintable(QString("%1 between stops %2 and %3").arg(scaleName(kind)).arg(i).arg(i + 1)));
        }
    }
}

void TestHeatmapView::absentCellsAreTransparent()
{
    for (ScaleKind kind : {ScaleKind::Error, ScaleKind::Ratio, ScaleKind::Bc, ScaleKind::Change})
        QCOMPARE(QColor::fromRgba(colorGradient(kind).color(std::nan(""), QCPRange(0, 1))).alpha(), 0);
}

void TestHeatmapView::rowLabelsNeverOverlapAtSmallSizes()
{
    // What the map gets of a 1024x700 window (toolbar, tabs, drill-down and side panel taken),
    // and smaller; 24 to 126 layers.
    for (const QSize size : {QSize(700, 330), QSize(560, 240), QSize(1000, 600)})
        for (int rows : {24, 80, 126}) {
            HeatmapView view;
            view.resize(size);
            view.show();
            view.resetView(512, rows);
            view.setRowLabels(layerLabels(rows));
            view.replot();
            const QList<double> pixels = tickPixels(view.yAxis);
            const int line = QFontMetrics(view.yAxis->tickLabelFont()).height();
            QVERIFY2(!pixels.isEmpty(), "some rows are labelled");
            QVERIFY2(closest(pixels) >= line - 0.5,
                     qPrintable(QString("%1 rows at %2x%3: labels %4 px apart, a line is %5 px")
                                    .arg(rows).arg(size.width()).arg(size.height()).arg(closest(pixels)).arg(line)));
        }
}

void TestHeatmapView::pinnedRowsKeepTheirLabels()
{
    HeatmapView view;
    view.resize(700, 330);
    view.show();
    view.resetView(512, 80);
    view.setRowLabels(layerLabels(80));
    view.setPinnedRows({13, 14, 61});
    view.replot();
    const auto ticker = qSharedPointerCast<QCPAxisTickerText>(view.yAxis->ticker());
    QVERIFY(ticker->ticks().contains(13));
    QVERIFY(ticker->ticks().contains(61));
    QCOMPARE(ticker->ticks().value(13), QString("model.layers.13 [full]"));
    // Two pinned rows next to each other may both be labelled (both matter); no unpinned label
    // comes closer to a pinned one than the thinning step.
    const int line = QFontMetrics(view.yAxis->tickLabelFont()).height();
    for (auto it = ticker->ticks().cbegin(); it != ticker->ticks().cend(); ++it)
        for (double pinned : {13.0, 61.0})
            if (it.key() != pinned && it.key() != 14.0)
                QVERIFY2(std::abs(view.yAxis->coordToPixel(it.key()) - view.yAxis->coordToPixel(pinned)) >= line - 0.5,
                         qPrintable(QString("row %1 beside pinned %2").arg(it.key()).arg(pinned)));
}

void TestHeatmapView::tokenTextNeverRunsTogether()
{
    HeatmapView view;
    view.resize(700, 330);
    view.show();
    view.resetView(512, 24);
    QStringList tokens;
    for (int t = 0; t < 512; ++t)
        tokens << QString(" token_%1_text").arg(t);
    view.setTokenLabels(tokens);
    for (double width : {8.0, 20.0, 35.0}) {  // zoomed in far enough for text
        view.xAxis->setRange(100, 100 + width);
        view.setTokenLabels(tokens);
        view.replot();
        const QList<double> pixels = tickPixels(view.xAxis);
        QVERIFY(!pixels.isEmpty());
        const QFontMetrics metrics(view.xAxis->tickLabelFont());
        int widest = 0;
        for (int t = 100; t <= 100 + int(width); ++t)
            widest = std::max({widest, metrics.horizontalAdvance(QString::number(t)),
                               metrics.horizontalAdvance(tokens[t].left(10))});
        QVERIFY2(pixels.size() < 2 || closest(pixels) >= widest,
                 qPrintable(QString("%1 tokens shown: labels %2 px apart, the widest %3 px").arg(width).arg(closest(pixels)).arg(widest)));
    }
}

// kvscope transfer's three values, over its range -0.5..2.5: each the middle of its band.
void TestHeatmapView::transferCellsTakeTheirBand()
{
    const QCPColorGradient g = colorGradient(ScaleKind::Transfer);
    const ValueRange r = defaultRange(ScaleKind::Transfer);
    const auto colour = [&](double v) { return at(g, (v - r.lower) / (r.upper - r.lower)); };
    QCOMPARE(colour(0), QColor(226, 235, 222));  // identical: the ratio's quiet colour
    QCOMPARE(colour(1), QColor(253, 174, 97));   // changed, explained
    QCOMPARE(colour(2), QColor(215, 48, 31));    // changed, unexplained
    QCOMPARE(legendWords(ScaleKind::Transfer).size(), std::size_t(3));
}

// The strip under the map: hidden without provenance; under the map's axis, the position under
// a pixel is the map's, through zoom; the hover names the range.
void TestHeatmapView::provenanceStripFollowsTheMap()
{
    QWidget box;
    auto* layout = new QVBoxLayout(&box);
    layout->setContentsMargins(0, 0, 0, 0);
    auto* map = new HeatmapView;
    auto* strip = new ProvenanceStrip(map);
    layout->addWidget(map, 1);
    layout->addWidget(strip);
    box.resize(900, 400);
    HeatmapGrid grid;
    grid.rows = 2;
    grid.columns = 100;
    grid.values.assign(200, 1.0f);
    grid.heads.assign(200, -1);
    map->setGrid(grid);
    map->resetView(100, 2);
    box.show();
    QVERIFY(QTest::qWaitForWindowExposed(&box));
    QVERIFY(!strip->isVisible());
    ProvenanceRange prefill{0, 64, ProvenanceKind::Prefill}, loaded{64, 96, ProvenanceKind::External}, step{96, 100, ProvenanceKind::Decode};
    prefill.chunk = 0;
    loaded.connector = "NixlConnector";
    step.step = 0;
    strip->setProvenance({prefill, loaded, step});
    QVERIFY(strip->isVisible());
    QCOMPARE(strip->describeAt(70), QString("position 70: 64-95 external (NixlConnector)"));
    QCOMPARE(strip->describeAt(20), QString("position 20: 0-63 prefill (chunk 0)"));
    map->replot(QCustomPlot::rpImmediateRefresh);
    QCOMPARE(strip->positionAt(int(map->xAxis->coordToPixel(70))), qint64(70));
    map->xAxis->setRange(60, 80);  // zoomed in
    map->replot(QCustomPlot::rpImmediateRefresh);
    QCOMPARE(strip->positionAt(int(map->xAxis->coordToPixel(65))), qint64(65));
    QCOMPARE(strip->positionAt(map->axisRect()->rect().left() - 5), qint64(-1));  // left of the axis
    QCOMPARE(ProvenanceStrip::kindColour(ProvenanceKind::External), QColor("#e08214"));
    strip->setProvenance({});
    QVERIFY(!strip->isVisible());
}

QTEST_MAIN(TestHeatmapView)
#include "tst_heatmap_view.moc"
