#include "widgets/histogram_view.h"

#include "widgets/integer_ticker.h"

#include "widgets/plot_decorations.h"

#include <algorithm>

namespace kvscope {

namespace {

const QColor kBaseColor(31, 119, 180);
const QColor kActualColor(230, 85, 13);

QCPGraph* stepGraph(QCustomPlot* plot, const QColor& colour, Qt::BrushStyle brush = Qt::SolidPattern)
{
    QCPGraph* g = plot->addGraph();
    g->setLineStyle(QCPGraph::lsStepLeft);
    g->setPen(QPen(colour, 1.2));
    QColor fill = colour;
    fill.setAlpha(brush == Qt::SolidPattern ? 90 : 200);
    g->setBrush(QBrush(fill, brush));
    return g;
}

// A filled step curve over `edges` with `counts` (one more point closes the last bin). On a
// log count axis empty bins drop below the axis instead of to an impossible 0.
void setSteps(QCPGraph* graph, const std::vector<double>& edges, const std::vector<double>& counts, bool logCounts)
{
    QVector<double> keys, values;
    for (std::size_t i = 0; i < counts.size(); ++i) {
        keys << edges[i];
        values << (logCounts ? std::max(counts[i], 0.1) : counts[i]);
    }
    if (!counts.empty()) {
        keys << edges.back();
        values << values.back();
    }
    graph->setData(keys, values, true);
}

}  // namespace

HistogramView::HistogramView(QWidget* parent)
    : QCustomPlot(parent)
{
    setMinimumSize(130, 130);  // beside the heads table on a 1024x700 screen, and under the Compare page's map
    m_title = addPlotTitle(this, 8);
    m_base = stepGraph(this, kBaseColor);
    m_actual = stepGraph(this, kActualColor);
    m_overflowBase = stepGraph(this, kBaseColor, Qt::BDiagPattern);
    m_overflowActual = stepGraph(this, kActualColor, Qt::FDiagPattern);
    m_base->setName("base");
    m_actual->setName("actual");
    m_overflowBase->removeFromLegend();
    m_overflowActual->removeFromLegend();
    yAxis->setLabel("count");
    yAxis->setTicker(QSharedPointer<QCPAxisTicker>(new IntegerAxisTicker));
    placeLegendAbove(this);
    setLogErrors(true);
}

void HistogramView::setHistogram(const HeadErrorHistogram& h, const QString& title)
{
    m_histogram = h;
    setAxesVisible(this, true);
    // The reference tool's BC over this head's values: not the map's BC vs noise floor.
    m_titleText = title + (std::isnan(h.bc) ? QString() : tr(" · reference tool's BC %1").arg(h.bc, 0, 'f', 4));
    redraw();
}

const DisplayBins* HistogramView::shownBins() const
{
    if (!m_histogram)
        return nullptr;
    return m_logErrors ? &m_histogram->logBins : &m_histogram->linearBins;
}

QString HistogramView::apartLabel() const
{
    return m_apartText;
}

void HistogramView::setLogCounts(bool log)
{
    m_logCounts = log;
    yAxis->setScaleType(log ? QCPAxis::stLogarithmic : QCPAxis::stLinear);
    yAxis->setTicker(log ? QSharedPointer<QCPAxisTicker>(new QCPAxisTickerLog) : QSharedPointer<QCPAxisTicker>(new IntegerAxisTicker));
    fitTicks();
    redraw();
}

void HistogramView::setLogErrors(bool log)
{
    m_logErrors = log;
    xAxis->setScaleType(log ? QCPAxis::stLogarithmic : QCPAxis::stLinear);
    xAxis->setTicker(QSharedPointer<QCPAxisTicker>(log ? new QCPAxisTickerLog : new QCPAxisTicker));
    fitTicks();
    xAxis->setNumberFormat(log ? "eb" : "gb");  // log: 10^-3 as a power
    xAxis->setNumberPrecision(log ? 0 : 3);
    xAxis->setLabel(log ? "|baseline - x| (log scale)" : "|baseline - x|");
    redraw();
}

void HistogramView::redraw()
{
    for (QCPGraph* g : {m_base, m_actual, m_overflowBase, m_overflowActual})
        g->data()->clear();
    m_apartText.clear();
    const DisplayBins* bins = shownBins();
    if (!bins) {
        replot(QCustomPlot::rpQueuedReplot);
        return;
    }
    setTitle(m_titleText);
    const bool threeWay = !bins->base.empty();
    m_base->setVisible(threeWay);
    if (threeWay)  // a two-way capture has no base: its legend does not name one
        m_base->addToLegend();
    else
        m_base->removeFromLegend();
    if (m_histogram->tokensUsed == 0) {
        setTitle(m_titleText + tr(": no data for this cell (a side does not hold this position, e.g. outside a freed window)"));
        setAxesVisible(this, false);
        replot(QCustomPlot::rpQueuedReplot);
        return;
    }
    if (bins->edges.empty()) {
        setTitle(m_titleText + tr("  (every error is exactly 0)"));
        replot(QCustomPlot::rpQueuedReplot);
        return;
    }
    setSteps(m_actual, bins->edges, bins->actual, m_logCounts);
    if (threeWay)
        setSteps(m_base, bins->edges, bins->base, m_logCounts);
    double top = 0;
    for (const std::vector<double>* counts : {&bins->base, &bins->actual})
        for (double c : *counts)
            top = std::max(top, c);
    double right = bins->edges.back();
    const std::int64_t apart = bins->baseApart + bins->actualApart;
    if (apart > 0) {
        QString label;
        if (bins->logarithmic) {
            label = tr("= 0: ");
        } else {
            // The overflow bar: one more bin width past the cut, hatched.
            const double width = bins->edges[1] - bins->edges[0];
            const std::vector<double> edges{right, right + width};
            setSteps(m_overflowActual, edges, {double(bins->actualApart)}, m_logCounts);
            if (threeWay)
                setSteps(m_overflowBase, edges, {double(bins->baseApart)}, m_logCounts);
            top = std::max({top, double(bins->actualApart), double(bins->baseApart)});
            right += width;
            label = tr("> %1: ").arg(bins->edges.back(), 0, 'g', 3);
        }
        label += threeWay ? tr("base %1, actual %2").arg(bins->baseApart).arg(bins->actualApart)
                          : tr("%1").arg(bins->actualApart);
        // Under the title, which wraps: inside the plot it ran over the y axis when narrow.
        m_apartText = label;
        setTitle(m_titleText + '\n' + label);
    }
    xAxis->setRange(bins->edges.front(), right);
    // Headroom above the tallest bar (and the label); a log axis needs a positive floor.
    yAxis->setRange(m_logCounts ? 0.5 : 0, m_logCounts ? std::max(top, 1.0) * 4 : std::max(top, 1.0) * 1.15);
    replot(QCustomPlot::rpQueuedReplot);
}

QString HistogramView::message() const
{
    return m_shownTitle;
}

void HistogramView::setTitle(const QString& text)
{
    m_shownTitle = text;
    setWrappedTitle(m_title, text, width() - 8);
}

void HistogramView::fitTicks()
{
    // At most 4 error ticks, fewer in a narrow plot: powers of ten ran together at 150 pixels;
    const int label = QFontMetrics(xAxis->tickLabelFont()).horizontalAdvance("0.00123");
    const int axisWidth = axisRect()->width() > 0 ? axisRect()->width() : width() - 60;
    xAxis->ticker()->setTickCount(std::clamp(axisWidth / (label + 16), 2, 4));
    // and the counts: a short panel (a 700-pixel screen) ran 125, 100, 75, 50 together
    const int line = QFontMetrics(yAxis->tickLabelFont()).height();
    const int axisHeight = axisRect()->height() > 0 ? axisRect()->height() : height() - 80;
    yAxis->ticker()->setTickCount(std::clamp(axisHeight / (2 * line), 2, 5));
}

void HistogramView::resizeEvent(QResizeEvent* event)
{
    QCustomPlot::resizeEvent(event);
    fitTicks();
    setWrappedTitle(m_title, m_shownTitle, width() - 8);
}

void HistogramView::clearHistogram(const QString& message)
{
    m_histogram.reset();
    for (QCPGraph* g : {m_base, m_actual, m_overflowBase, m_overflowActual})
        g->data()->clear();
    m_apartText.clear();
    setTitle(message);
    setAxesVisible(this, false);
    replot(QCustomPlot::rpQueuedReplot);
}

}  // namespace kvscope
