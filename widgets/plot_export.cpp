#include "widgets/plot_export.h"

#include <qcustomplot.h>

#include <QFileInfo>
#include <QSvgGenerator>

namespace kvscope {

bool exportPlot(QCustomPlot& plot, const QString& path)
{
    const QString suffix = QFileInfo(path).suffix().toLower();
    plot.replot(QCustomPlot::rpImmediateRefresh);  // a queued replot may not have run yet
    if (suffix == "png")
        return plot.savePng(path, plot.width(), plot.height(), 2.0);
    if (suffix == "pdf")
        return plot.savePdf(path, plot.width(), plot.height());
    if (suffix == "svg") {
        QSvgGenerator svg;
        svg.setFileName(path);
        svg.setSize(plot.size());
        svg.setViewBox(QRect(QPoint(0, 0), plot.size()));
        svg.setTitle("kvscope view");
        QCPPainter painter;
        if (!painter.begin(&svg))
            return false;
        plot.toPainter(&painter, plot.width(), plot.height());
        return painter.end();
    }
    return false;
}

}  // namespace kvscope
