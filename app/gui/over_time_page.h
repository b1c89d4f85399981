#pragma once
// The "Over time" page: a soak run (a sweep of captures taken one after another, or one capture
// of many requests) as each layer's worst cell per capture, in order of capture time, and the
// worst cell against time with the trend said (analysis/sweep_timeline.h). Corruption that builds
// up under load shows as a row turning loud and a rising line. Computed off the GUI thread once
// the analysis has finished.

#include "analysis/sweep_timeline.h"
#include "gui/page.h"

#include <QSplitter>

#include <optional>

namespace kvscope {

class AnalysisController;
class HeatmapView;
class TimelineView;

class OverTimePage : public QSplitter, public Page {
    Q_OBJECT

public:
    explicit OverTimePage(AnalysisController* controller, QWidget* parent = nullptr);

    QWidget* widget() override { return this; }
    QString title() const override { return tr("Over time"); }
    QString unavailable() const override;
    HeatmapView& exportedMap() override { return *m_map; }
    void captureOpened() override { clear(); }
    void captureAnalysed() override;
    void captureClosed(const QString&) override { clear(); }
    const std::optional<SweepTimeline>& timeline() const { return m_timeline; }
    HeatmapView& heatmap() { return *m_map; }

signals:
    void timelineShown();

private:
    void clear();
    void show(std::optional<SweepTimeline> timeline);

    AnalysisController* m_controller;
    HeatmapView* m_map;
    TimelineView* m_line;
    std::optional<SweepTimeline> m_timeline;
    bool m_computed = false;  // the finished analysis's timeline was computed (maybe none)
};

}  // namespace kvscope
