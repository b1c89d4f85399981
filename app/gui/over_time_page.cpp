#include "gui/over_time_page.h"

#include "gui/analysis_controller.h"
#include "widgets/heatmap_view.h"
#include "widgets/timeline_view.h"

#include <QToolTip>

#include <cmath>

namespace kvscope {

OverTimePage::OverTimePage(AnalysisController* controller, QWidget* parent)
    : QSplitter(Qt::Vertical, parent), m_controller(controller), m_map(new HeatmapView), m_line(new TimelineView)
{
    setObjectName("overTime");
    addWidget(m_map);
    addWidget(m_line);
    setStretchFactor(0, 3);
    setStretchFactor(1, 2);
    setCollapsible(0, false);
    clear();
    connect(m_map, &HeatmapView::cellHovered, this, [this](int row, qint64 column, const QPoint& at) {
        if (!m_timeline || row < 0 || row >= int(m_timeline->layers.size()) || column < 0 ||
            column >= qint64(m_timeline->points.size()))
            return QToolTip::hideText();
        const TimelinePoint& p = m_timeline->points[std::size_t(column)];
        const float off = std::size_t(row) < p.layerOff.size() ? p.layerOff[std::size_t(row)] : std::nanf("");
        QToolTip::showText(at,
                           tr("<b>%1</b><br>%2%3<br>worst cell %4 x the layer's off threshold")
                               .arg(QString::fromStdString(m_timeline->layers[std::size_t(row)]).toHtmlEscaped(),
                                    QString::fromStdString(p.name).toHtmlEscaped(),
                                    p.created.empty() ? QString() : tr(", captured %1").arg(QString::fromStdString(p.created)),
                                    std::isnan(off) ? tr("no data") : QString::number(off, 'g', 3)),
                           m_map);
    });
}

QString OverTimePage::unavailable() const
{
    if (!m_controller->result())
        return tr("Open a capture first");
    if (m_controller->isRunning() || !m_computed)
        return tr("Over time is shown when the analysis has finished");
    if (!m_timeline)
        return tr("Over time needs a soak run: a sweep of several captures (a folder), or one capture of five prompts or more");
    return {};
}

void OverTimePage::clear()
{
    m_timeline.reset();
    m_computed = false;
    m_map->showEmpty(tr("A soak run's captures over time: open a folder of captures"));
    m_line->clearTimeline(tr("No soak run open"));
}

void OverTimePage::captureAnalysed()
{
    // Every cell of every prompt is read: off the GUI thread.
    m_controller->door().ask("over time", this, [this, result = m_controller->result(),
                                                  thresholds = m_controller->recorded().suspects](EngineJob& job) {
        std::optional<SweepTimeline> timeline = result ? sweepTimeline(*result, thresholds) : std::nullopt;
        job.deliver([this, timeline = std::move(timeline)]() mutable { show(std::move(timeline)); });
    });
}

void OverTimePage::show(std::optional<SweepTimeline> timeline)
{
    m_timeline = std::move(timeline);
    m_computed = true;
    if (m_timeline) {
        const HeatmapGrid grid = timelineGrid(*m_timeline);
        const MapSpec spec = timelineMapSpec(*m_timeline);
        m_map->setGrid(grid);
        m_map->showMap(spec);
        m_map->setScale(ScaleKind::Ratio, QCPRange(spec.range.lower, spec.range.upper), true);
        m_map->resetView(grid.columns, grid.rows);
        m_line->setTimeline(*m_timeline);
    }
    emit timelineShown();
}

}  // namespace kvscope
