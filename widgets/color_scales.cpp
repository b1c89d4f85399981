#include "widgets/color_scales.h"

namespace kvscope {

QCPColorGradient colorGradient(ScaleKind kind)
{
    QCPColorGradient g;
    g.clearColorStops();
    switch (kind) {
    case ScaleKind::Error:  // YlOrRd: yellow = low error, red = high
        g.setColorStopAt(0.0, QColor(255, 255, 204));
        g.setColorStopAt(0.25, QColor(254, 217, 118));
        g.setColorStopAt(0.5, QColor(253, 141, 60));
        g.setColorStopAt(0.75, QColor(227, 26, 28));
        g.setColorStopAt(1.0, QColor(128, 0, 38));
        break;
    case ScaleKind::Ratio:  // RdYlGn reversed: green = like dtype noise, red = far worse
        g.setColorStopAt(0.0, QColor(0, 104, 55));
        g.setColorStopAt(0.25, QColor(102, 189, 99));
        g.setColorStopAt(0.5, QColor(255, 255, 191));
        g.setColorStopAt(0.75, QColor(244, 109, 67));
        g.setColorStopAt(1.0, QColor(165, 0, 38));
        break;
    case ScaleKind::Bc:  // the reference's stops: below 0.8 flat red
        g.setColorStopAt(0.0, QColor(215, 25, 28));
        g.setColorStopAt(0.8, QColor(215, 25, 28));
        g.setColorStopAt(0.85, QColor(253, 174, 97));
        g.setColorStopAt(0.90, QColor(255, 255, 191));
        g.setColorStopAt(0.95, QColor(166, 217, 106));
        g.setColorStopAt(1.0, QColor(26, 150, 65));
        break;
    }
    g.setColorInterpolation(QCPColorGradient::ciRGB);
    // Absent cells are transparent: the hatched background shows through, never a colour of the scale.
    g.setNanHandling(QCPColorGradient::nhTransparent);
    g.setLevelCount(350);
    return g;
}

QCPRange defaultRange(ScaleKind kind)
{
    switch (kind) {
    case ScaleKind::Error:
        return {0.0, 0.2};
    case ScaleKind::Ratio:
        return {0.0, 3.0};
    case ScaleKind::Bc:
        return {0.0, 1.0};
    }
    return {0.0, 1.0};
}

}  // namespace kvscope
