#include "widgets/histogram_view.h"

#include "widgets/plot_decorations.h"

namespace kvscope {

HistogramView::HistogramView(QWidget* parent)
    : QCustomPlot(parent)
{
    setMinimumSize(300, 180);
    m_title = addPlotTitle(this, 9);
    m_base = new QCPBars(xAxis, yAxis);
    m_actual = new QCPBars(xAxis, yAxis);
    m_base->setName("base: |baseline - expected|");
    m_actual->setName("actual: |baseline - actual|");
    m_base->setPen(Qt::NoPen);
    m_actual->setPen(Qt::NoPen);
    m_base->setBrush(QColor(31, 119, 180, 140));
    m_actual->setBrush(QColor(255, 127, 14, 140));
    xAxis->setLabel("absolute error");
    yAxis->setLabel("count");
    legend->setVisible(true);
    legend->setFont(QFont(font().family(), 8));
    axisRect()->insetLayout()->setInsetAlignment(0, Qt::AlignTop | Qt::AlignRight);
}

void HistogramView::setHistogram(const HeadErrorHistogram& h, const QString& title)
{
    const double width = (h.hi - h.lo) / h.bins;
    QVector<double> keys, base, actual;
    for (int b = 0; b < h.bins; ++b) {
        keys.append(h.lo + (b + 0.5) * width);
        actual.append(double(h.actual.counts[std::size_t(b)]));
        base.append(h.base ? double(h.base->counts[std::size_t(b)]) : 0.0);
    }
    m_base->setWidth(width);
    m_actual->setWidth(width);
    m_base->setData(keys, base);
    m_actual->setData(keys, actual);
    m_base->setVisible(bool(h.base));
    m_title->setText(title + (std::isnan(h.bc) ? QString() : QString("   BC %1").arg(h.bc, 0, 'f', 4)));
    rescaleAxes();
    if (yAxis->scaleType() == QCPAxis::stLogarithmic)
        yAxis->setRangeLower(0.5);
    replot(QCustomPlot::rpQueuedReplot);
}

void HistogramView::setLogCounts(bool log)
{
    yAxis->setScaleType(log ? QCPAxis::stLogarithmic : QCPAxis::stLinear);
    yAxis->setTicker(log ? QSharedPointer<QCPAxisTicker>(new QCPAxisTickerLog) : QSharedPointer<QCPAxisTicker>(new QCPAxisTicker));
    rescaleAxes();
    if (log)
        yAxis->setRangeLower(0.5);
    replot(QCustomPlot::rpQueuedReplot);
}

void HistogramView::clearHistogram(const QString& message)
{
    m_base->data()->clear();
    m_actual->data()->clear();
    m_title->setText(message);
    replot(QCustomPlot::rpQueuedReplot);
}

}  // namespace kvscope
