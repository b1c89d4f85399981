#include "widgets/timeline_view.h"

#include "widgets/plot_decorations.h"

#include <QToolTip>

#include <cmath>

namespace kvscope {

TimelineView::TimelineView(QWidget* parent) : QCustomPlot(parent)
{
    setObjectName("timelineView");
    setMinimumSize(300, 160);
    plotLayout()->insertRow(0);
    m_title = new QCPTextElement(this, QString(), QFont(font().family(), font().pointSize(), QFont::Bold));
    plotLayout()->addElement(0, 0, m_title);
    m_line = addGraph();
    m_line->setPen(QPen(QColor(120, 120, 120), 1));
    m_quiet = addGraph();
    m_quiet->setLineStyle(QCPGraph::lsNone);
    m_quiet->setScatterStyle(QCPScatterStyle(QCPScatterStyle::ssDisc, QColor(90, 120, 160), 7));
    m_quiet->setName(tr("no cell off the noise floor"));
    m_off = addGraph();
    m_off->setLineStyle(QCPGraph::lsNone);
    m_off->setScatterStyle(QCPScatterStyle(QCPScatterStyle::ssDisc, QColor(215, 48, 31), 8));
    m_off->setName(tr("cells off the noise floor"));
    yAxis->setScaleType(QCPAxis::stLogarithmic);
    yAxis->setTicker(QSharedPointer<QCPAxisTicker>(new QCPAxisTickerLog));
    yAxis->setLabel(tr("worst cell, floors"));
    legend->setVisible(true);
    legend->removeItem(0);  // (the line has no entry)
    axisRect()->insetLayout()->setInsetAlignment(0, Qt::AlignTop | Qt::AlignLeft);
    setMouseTracking(true);
}

void TimelineView::clearTimeline(const QString& message)
{
    m_timeline = {};
    for (QCPGraph* g : {m_line, m_quiet, m_off})
        g->data()->clear();
    setTitle(message);
    replot(rpQueuedReplot);
}

void TimelineView::setTimeline(const SweepTimeline& timeline)
{
    m_timeline = timeline;
    QVector<double> x, y, offX, offY, quietX, quietY;
    double lowest = 1, highest = 10;
    for (const TimelinePoint& p : timeline.points) {
        if (!std::isfinite(p.worstRatio))
            continue;
        const double value = std::max(double(p.worstRatio), 1e-3);
        x << p.x;
        y << value;
        (p.offFraction > 0 ? offX : quietX) << p.x;
        (p.offFraction > 0 ? offY : quietY) << value;
        lowest = std::min(lowest, value);
        highest = std::max(highest, value);
    }
    m_line->setData(x, y, true);
    m_quiet->setData(quietX, quietY, true);
    m_off->setData(offX, offY, true);
    xAxis->setLabel(timeline.byTime ? tr("seconds since the first capture")
                                    : timeline.perBundle ? tr("bundle (in name order)") : tr("request index (prompt order)"));
    const double first = x.isEmpty() ? 0 : x.front(), last = x.isEmpty() ? 1 : x.back();
    const double pad = std::max(0.5, (last - first) * 0.03);
    xAxis->setRange(first - pad, last + pad);
    yAxis->setRange(lowest / 2, highest * 2);
    setTitle(timeline.trend.empty() ? tr("Worst cell per %1: no rising trend").arg(timeline.perBundle ? tr("capture") : tr("request"))
                                    : QString::fromStdString(timeline.trend));
    replot(rpQueuedReplot);
}

void TimelineView::setTitle(const QString& title)
{
    m_titleText = title;
    m_title->setText(wrappedToWidth(title, m_title->font(), width() - 20));
}

void TimelineView::resizeEvent(QResizeEvent* event)
{
    setTitle(m_titleText);  // (a long trend wraps at a narrow width)
    QCustomPlot::resizeEvent(event);
}

int TimelineView::pointAt(const QPoint& pos) const
{
    int best = -1;
    double bestDistance = 8;  // pixels
    for (int i = 0; i < int(m_timeline.points.size()); ++i) {
        const TimelinePoint& p = m_timeline.points[std::size_t(i)];
        if (!std::isfinite(p.worstRatio))
            continue;
        const double dx = xAxis->coordToPixel(p.x) - pos.x();
        const double dy = yAxis->coordToPixel(std::max(double(p.worstRatio), 1e-3)) - pos.y();
        if (const double d = std::hypot(dx, dy); d < bestDistance) {
            bestDistance = d;
            best = i;
        }
    }
    return best;
}

void TimelineView::mouseMoveEvent(QMouseEvent* event)
{
    QCustomPlot::mouseMoveEvent(event);
    const int i = pointAt(event->position().toPoint());
    if (i < 0)
        return QToolTip::hideText();
    const TimelinePoint& p = m_timeline.points[std::size_t(i)];
    QToolTip::showText(event->globalPosition().toPoint(),
                       tr("<b>%1</b>%2<br>worst cell %3 floors; %4% of its cells off the noise floor; %5 of %6 prompt(s) with a suspect")
                           .arg(QString::fromStdString(p.name).toHtmlEscaped())
                           .arg(p.created.empty() ? QString() : tr(", captured %1").arg(QString::fromStdString(p.created)))
                           .arg(p.worstRatio, 0, 'g', 3)
                           .arg(100 * p.offFraction, 0, 'f', 2)
                           .arg(p.suspects)
                           .arg(p.prompts),
                       this);
}

}  // namespace kvscope
