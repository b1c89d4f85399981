#include "widgets/plot_decorations.h"

#include "widgets/color_scales.h"

#include <cmath>

namespace kvscope {

QCPTextElement* addPlotTitle(QCustomPlot* plot, int pointSize)
{
    plot->plotLayout()->insertRow(0);
    auto* title = new QCPTextElement(plot, QString(), QFont(plot->font().family(), pointSize, QFont::Bold));
    plot->plotLayout()->addElement(0, 0, title);
    return title;
}

void setWrappedTitle(QCPTextElement* title, const QString& text, int width)
{
    title->setText(wrappedToWidth(text, title->font(), width));
}

QString wrappedToWidth(const QString& text, const QFont& font, int width)
{
    const QFontMetrics metrics(font);
    QStringList lines;
    for (const QString& paragraph : text.split('\n')) {
        QString line;
        for (const QString& word : paragraph.split(' ', Qt::SkipEmptyParts)) {
            const QString longer = line.isEmpty() ? word : line + ' ' + word;
            if (!line.isEmpty() && metrics.horizontalAdvance(longer) > width) {
                lines << line;
                line = word;  // a word wider than the plot stays whole
            } else {
                line = longer;
            }
        }
        lines << line;
    }
    return lines.join('\n');
}

void placeLegendAbove(QCustomPlot* plot, int rowIndex)
{
    QCPLegend* legend = plot->legend;
    legend->setVisible(true);
    legend->setFont(QFont(plot->font().family(), 8));
    legend->setFillOrder(QCPLayoutGrid::foColumnsFirst);
    legend->setBorderPen(Qt::NoPen);
    legend->setBrush(Qt::NoBrush);
    // Short icons: two entries fit a plot of 150 pixels (the drill-down's line on a 1024 screen).
    legend->setIconSize(16, 10);
    legend->setIconTextPadding(3);
    auto* row = new QCPLayoutGrid;
    plot->plotLayout()->insertRow(rowIndex);
    plot->plotLayout()->addElement(rowIndex, 0, row);
    plot->plotLayout()->setRowStretchFactor(rowIndex, 0.001);
    row->setMargins(QMargins(0, 0, 0, 0));
    plot->axisRect()->insetLayout()->take(legend);
    row->addElement(0, 0, legend);
}

void setAxesVisible(QCustomPlot* plot, bool visible)
{
    for (QCPAxis* axis : {plot->xAxis, plot->yAxis}) {
        axis->setVisible(visible);
        axis->grid()->setVisible(visible);
    }
    plot->legend->setVisible(visible);
}

void addVerticalLine(QCustomPlot* plot, QList<QCPAbstractItem*>& items, double x, const QPen& pen)
{
    auto* line = new QCPItemStraightLine(plot);
    line->point1->setCoords(x, 0);
    line->point2->setCoords(x, 1);
    line->setPen(pen);
    items.append(line);
}

void setTokenMarkers(QCustomPlot* plot, QList<QCPAbstractItem*>& items, double prefillBoundary,
                     const QVector<double>& divergences, qreal width)
{
    for (QCPAbstractItem* item : std::as_const(items))
        plot->removeItem(item);
    items.clear();
    // Each line over a white outline twice its width: visible on every colour of every scale.
    auto marker = [&](double x, Rgb colour, Qt::PenStyle style) {
        addVerticalLine(plot, items, x, QPen(toQColor(kMarkerOutlineColor), width + 2, Qt::SolidLine));
        addVerticalLine(plot, items, x, QPen(toQColor(colour), width, style));
    };
    if (!std::isnan(prefillBoundary))
        marker(prefillBoundary, kPrefillLineColor, Qt::SolidLine);
    for (double d : divergences)
        marker(d, kDivergenceLineColor, Qt::DashLine);
}

}  // namespace kvscope
