#include "widgets/token_line_view.h"

#include "widgets/plot_decorations.h"

#include <algorithm>
#include <cmath>

namespace kvscope {

TokenLineView::TokenLineView(QWidget* parent)
    : QCustomPlot(parent)
{
    setMinimumSize(200, 160);
    m_title = addPlotTitle(this, 9);
    m_actual = addGraph();
    m_base = addGraph();
    m_actual->setName("actual");
    m_base->setName("base");
    m_actual->setPen(QPen(QColor(214, 39, 40), 1.5));
    m_base->setPen(QPen(QColor(31, 119, 180), 1.2));
    xAxis->setLabel("token");
    placeLegendAbove(this);
    setInteractions(QCP::iRangeDrag | QCP::iRangeZoom);
    axisRect()->setRangeZoom(Qt::Horizontal);
    axisRect()->setRangeDrag(Qt::Horizontal);
}

void TokenLineView::setSeries(const QVector<double>& actual, const QVector<double>& base, const QString& title,
                              const QString& valueLabel, double prefillBoundary, const QVector<double>& divergences,
                              qint64 selected)
{
    QVector<double> keys;
    for (int i = 0; i < actual.size(); ++i)
        keys.append(i);
    m_actual->setData(keys, actual, true);
    m_base->setData(keys, base.isEmpty() ? QVector<double>(actual.size(), std::nan("")) : base, true);
    m_base->setVisible(!base.isEmpty());
    m_title->setText(title);
    setAxesVisible(this, true);
    yAxis->setLabel(valueLabel);
    setTokenMarkers(this, m_markers, prefillBoundary, divergences, 1.5);
    if (selected >= 0)
        addVerticalLine(this, m_markers, double(selected), QPen(Qt::black, 1, Qt::DotLine));
    // Fitted to the data with headroom, so no curve touches the frame.
    double top = 0;
    for (const QVector<double>* series : {&actual, &base})
        for (double v : *series)
            if (std::isfinite(v))
                top = std::max(top, v);
    yAxis->setRange(0, top > 0 ? top * 1.1 : 1);
    xAxis->setRange(-0.5, std::max<double>(actual.size(), 1) - 0.5);
    replot(QCustomPlot::rpQueuedReplot);
}

void TokenLineView::clearSeries(const QString& message)
{
    m_actual->data()->clear();
    m_base->data()->clear();
    m_title->setText(message);
    setTokenMarkers(this, m_markers, std::nan(""), {});
    setAxesVisible(this, false);
    replot(QCustomPlot::rpQueuedReplot);
}

}  // namespace kvscope
