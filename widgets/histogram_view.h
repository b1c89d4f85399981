#pragma once
// Per-head error histograms of the drill-down: base (expected vs baseline) and actual (actual
// vs baseline) errors overlaid as filled steps, on a log error axis (default: a fault's errors
// and dtype noise differ by orders of magnitude) or a linear one cut at the 99th percentile
// with the rest in a labelled overflow bar; counts linear or log; axes fitted to the data.

#include "metrics/error_histogram.h"

#include <qcustomplot.h>

namespace kvscope {

class HistogramView : public QCustomPlot {
    Q_OBJECT

public:
    explicit HistogramView(QWidget* parent = nullptr);
    void setHistogram(const HeadErrorHistogram& histogram, const QString& title);
    void setLogCounts(bool log);
    void setLogErrors(bool log);
    void clearHistogram(const QString& message);
    // What the view says at the top: the title, or why there is no histogram.
    QString message() const;
    bool hasHistogram() const { return m_histogram.has_value(); }
    // What is drawn, for the tests: the bins shown and the label of the counts kept apart.
    const DisplayBins* shownBins() const;
    QString apartLabel() const;

protected:
    void resizeEvent(QResizeEvent* event) override;

private:
    void redraw();
    void setTitle(const QString& text);
    void fitTicks();

    QCPGraph* m_base;
    QCPGraph* m_actual;
    QCPGraph* m_overflowBase;
    QCPGraph* m_overflowActual;
    QCPTextElement* m_title;
    QString m_apartText;  // the counts kept apart (zeros, or beyond the cut), under the title
    std::optional<HeadErrorHistogram> m_histogram;
    QString m_titleText;  // the histogram's
    QString m_shownTitle;  // what the title says, unwrapped
    bool m_logCounts = false;
    bool m_logErrors = true;
};

}  // namespace kvscope
