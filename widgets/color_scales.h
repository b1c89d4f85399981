#pragma once
// The map colour scales of analysis/map_spec.h as QCustomPlot gradients and ranges.

#include "analysis/map_spec.h"

#include <qcustomplot.h>

namespace kvscope {

QCPColorGradient colorGradient(ScaleKind kind);
inline QCPRange toQcpRange(ValueRange r) { return {r.lower, r.upper}; }
inline QColor toQColor(Rgb c) { return QColor(c.r, c.g, c.b); }

}  // namespace kvscope
