#pragma once
// Reports draw their PNGs with the app's widgets, which need a QApplication, also where there
// is no display (CI, a server): then an offscreen one.

#include <QApplication>

#include <memory>

namespace kvscope {

// Whether a window could be shown (an X11 or Wayland display, and no offscreen platform).
bool hasDisplay();

// A QApplication for drawing, offscreen without a display; null when one exists already.
std::unique_ptr<QApplication> applicationForDrawing();

}  // namespace kvscope
