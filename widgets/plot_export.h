#pragma once
// A plot as the user sees it, to a file: PNG (at twice the screen's resolution), PDF or SVG,
// chosen by the file's extension.

#include <QString>

class QCustomPlot;

namespace kvscope {

// False for another extension or when the file cannot be written.
bool exportPlot(QCustomPlot& plot, const QString& path);

}  // namespace kvscope
