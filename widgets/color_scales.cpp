#include "widgets/color_scales.h"

namespace kvscope {

QCPColorGradient colorGradient(ScaleKind kind)
{
    QCPColorGradient g;
    g.clearColorStops();
    for (const ColorStop& stop : colorStops(kind))
        g.setColorStopAt(stop.at, toQColor(stop.color));
    g.setColorInterpolation(QCPColorGradient::ciRGB);
    // Absent cells are transparent: the hatched background shows through, never a colour of the scale.
    g.setNanHandling(QCPColorGradient::nhTransparent);
    g.setLevelCount(350);
    return g;
}

}  // namespace kvscope
