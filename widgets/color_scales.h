#pragma once
// The colour scales of the reference tool's heatmaps: errors yellow (low) to red (high),
// the error ratio green (low) to red (high), and the BC scale with its exact stops.

#include <qcustomplot.h>

namespace kvscope {

enum class ScaleKind { Error, Ratio, Bc };

QCPColorGradient colorGradient(ScaleKind kind);
// The seed's default ranges: errors 0..0.2, ratio 0..3, BC 0..1.
QCPRange defaultRange(ScaleKind kind);

}  // namespace kvscope
