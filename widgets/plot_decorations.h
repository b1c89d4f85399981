#pragma once
// What every kvscope plot shares: a title row, and the token markers of the reference tool
// (red solid line at the prefill/decode boundary, orange dashed lines at divergences).

#include <qcustomplot.h>

namespace kvscope {

QCPTextElement* addPlotTitle(QCustomPlot* plot, int pointSize);

// Replaces `items` (the previous markers, removed from the plot) by new ones; NaN boundary: none.
void setTokenMarkers(QCustomPlot* plot, QList<QCPAbstractItem*>& items, double prefillBoundary,
                     const QVector<double>& divergences, qreal width = 2);
// One more vertical line (e.g. the selected token), kept in `items`.
void addVerticalLine(QCustomPlot* plot, QList<QCPAbstractItem*>& items, double x, const QPen& pen);

}  // namespace kvscope
