#include "widgets/token_line_view.h"

#include "widgets/integer_ticker.h"

#include "widgets/plot_decorations.h"

#include <algorithm>
#include <cmath>

namespace kvscope {

TokenLineView::TokenLineView(QWidget* parent)
    : QCustomPlot(parent)
{
    setMinimumSize(130, 130);  // beside the heads table on a 1024x700 screen, and under the Compare page's map
    m_title = addPlotTitle(this, 9);
    m_actual = addGraph();
    m_base = addGraph();
    m_actual->setName("actual");
    m_base->setName("base");
    m_actual->setPen(QPen(QColor(214, 39, 40), 1.5));
    m_base->setPen(QPen(QColor(31, 119, 180), 1.2));
    xAxis->setLabel("token");
    xAxis->setTicker(QSharedPointer<QCPAxisTicker>(new IntegerAxisTicker));
    placeLegendAbove(this);
    setInteractions(QCP::iRangeDrag | QCP::iRangeZoom);
    axisRect()->setRangeZoom(Qt::Horizontal);
    axisRect()->setRangeDrag(Qt::Horizontal);
}

void TokenLineView::setSeriesNames(const QString& actual, const QString& base)
{
    m_actual->setName(actual);
    m_base->setName(base);
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
    if (base.isEmpty())  // (two-way: nothing to call base)
        m_base->removeFromLegend();
    else
        m_base->addToLegend();
    m_titleText = title;
    setWrappedTitle(m_title, title, width() - 20);
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
    fitTokenTicks();
    replot(QCustomPlot::rpQueuedReplot);
}

void TokenLineView::fitTokenTicks()
{
    // QCustomPlot's default of 5 ticks at 200 pixels ran "250", "500", "750", "1000" together.
    const QString widest = QString::number(qint64(std::ceil(std::abs(xAxis->range().upper))));
    const int room = 2 * QFontMetrics(xAxis->tickLabelFont()).horizontalAdvance(widest) + 12;
    const int axisWidth = axisRect()->width() > 0 ? axisRect()->width() : width() - 60;
    xAxis->ticker()->setTickCount(std::max(2, axisWidth / room));
    // And the values' ticks a line of text apart at least: a short plot (the Compare page's on
    // a 700-pixel screen) ran "10" to "50" into one another.
    const int axisHeight = axisRect()->height() > 0 ? axisRect()->height() : height() - 60;
    yAxis->ticker()->setTickCount(std::max(2, axisHeight / (2 * QFontMetrics(yAxis->tickLabelFont()).height())));
}

void TokenLineView::resizeEvent(QResizeEvent* event)
{
    QCustomPlot::resizeEvent(event);
    setWrappedTitle(m_title, m_titleText, width() - 20);
    fitTokenTicks();
}

void TokenLineView::clearSeries(const QString& message)
{
    m_actual->data()->clear();
    m_base->data()->clear();
    m_titleText = message;
    setWrappedTitle(m_title, message, width() - 20);
    setTokenMarkers(this, m_markers, std::nan(""), {});
    setAxesVisible(this, false);
    replot(QCustomPlot::rpQueuedReplot);
}

}  // namespace kvscope
