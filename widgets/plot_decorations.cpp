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
    if (!std::isnan(prefillBoundary))
        addVerticalLine(plot, items, prefillBoundary, QPen(toQColor(kPrefillLineColor), width, Qt::SolidLine));
    for (double d : divergences)
        addVerticalLine(plot, items, d, QPen(toQColor(kDivergenceLineColor), width, Qt::DashLine));
}

}  // namespace kvscope
