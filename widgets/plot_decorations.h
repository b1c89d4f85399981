#pragma once
// What every kvscope plot shares: a title row, and the token markers (a solid line at the
// prefill/decode boundary, dashed lines at divergences, colours in analysis/map_spec.h).

#include <qcustomplot.h>

namespace kvscope {

QCPTextElement* addPlotTitle(QCustomPlot* plot, int pointSize);
// `text` broken into lines at spaces to fit `width` pixels in `font` (QCustomPlot's texts do
// not wrap: a long message in a narrow panel would be cut on both sides). Again on resize.
QString wrappedToWidth(const QString& text, const QFont& font, int width);
void setWrappedTitle(QCPTextElement* title, const QString& text, int width);
// The legend in one row above the plot (`row`: 1 under a title, 0 without), never over the data.
void placeLegendAbove(QCustomPlot* plot, int row = 1);

// Replaces `items` (the previous markers, removed from the plot) by new ones; NaN boundary: none.
void setTokenMarkers(QCustomPlot* plot, QList<QCPAbstractItem*>& items, double prefillBoundary,
                     const QVector<double>& divergences, qreal width = 2);
// Axes, grids and legend shown or not: an empty plot should not read as data at zero.
void setAxesVisible(QCustomPlot* plot, bool visible);
// One more vertical line (e.g. the selected token), kept in `items`.
void addVerticalLine(QCustomPlot* plot, QList<QCPAbstractItem*>& items, double x, const QPen& pen);

}  // namespace kvscope
