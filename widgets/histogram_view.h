#pragma once
// Per-head error histograms of the drill-down: base (expected vs baseline) and actual (actual
// vs baseline) on shared bins, overlaid, with an optional log count axis and the BC.

#include "metrics/error_histogram.h"

#include <qcustomplot.h>

namespace kvscope {

class HistogramView : public QCustomPlot {
    Q_OBJECT

public:
    explicit HistogramView(QWidget* parent = nullptr);
    void setHistogram(const HeadErrorHistogram& histogram, const QString& title);
    void setLogCounts(bool log);
    void clearHistogram(const QString& message);

private:
    QCPBars* m_base;
    QCPBars* m_actual;
    QCPTextElement* m_title;
};

}  // namespace kvscope
