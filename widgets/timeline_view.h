#pragma once
// A soak run's worst cell against time (analysis/sweep_timeline.h): one point a capture (or a
// request), its worst cell in floors on a log axis, red where it has cells off the noise floor,
// the trend said in the title; a hover names the point.

#include "analysis/sweep_timeline.h"

#include <qcustomplot.h>

namespace kvscope {

class TimelineView : public QCustomPlot {
    Q_OBJECT

public:
    explicit TimelineView(QWidget* parent = nullptr);

    void setTimeline(const SweepTimeline& timeline);
    void clearTimeline(const QString& message);
    // The point nearest a widget position (within a few pixels), or -1.
    int pointAt(const QPoint& pos) const;

protected:
    void mouseMoveEvent(QMouseEvent* event) override;
    void resizeEvent(QResizeEvent* event) override;

private:
    void setTitle(const QString& title);

    SweepTimeline m_timeline;
    QCPGraph* m_quiet = nullptr;
    QCPGraph* m_off = nullptr;
    QCPGraph* m_line = nullptr;
    QCPTextElement* m_title = nullptr;
    QString m_titleText;  // as set; shown wrapped to the width
};

}  // namespace kvscope
