#include "widgets/impact_column.h"

#include "analysis/map_spec.h"
#include "widgets/color_scales.h"
#include "widgets/heatmap_view.h"

#include <QMouseEvent>
#include <QPainter>
#include <QToolTip>

#include <algorithm>
#include <cmath>

namespace kvscope {

namespace {

constexpr int kColumnWidth = 92;
constexpr int kPad = 4;
const QColor kWithinNoise("#bdbdbd");
const QColor kNoNoise("#8c96a8");

}  // namespace

ImpactColumn::ImpactColumn(HeatmapView* map, QWidget* parent) : QWidget(parent), m_map(map)
{
    setObjectName("impactColumn");
    setMouseTracking(true);
    setSizePolicy(QSizePolicy::Fixed, QSizePolicy::Preferred);
    hide();
    connect(m_map, &QCustomPlot::afterReplot, this, qOverload<>(&QWidget::update));
}

void ImpactColumn::setImpacts(std::vector<LayerImpact> layers)
{
    m_layers = std::move(layers);
    // One log scale for every bar and tick: from half the smallest positive KL shown (a bar of
    // it is visible) to the largest, at least a decade (layers within the noise differ little).
    m_lower = m_upper = 0;
    double smallest = INFINITY, largest = 0;
    for (const LayerImpact& l : m_layers)
        for (const std::optional<ImpactFigures>& f : {l.alone, l.aloneNoise})
            if (f && f->klMax > 0) {
                smallest = std::min(smallest, f->klMax);
                largest = std::max(largest, f->klMax);
            }
    const bool any = std::any_of(m_layers.begin(), m_layers.end(), [](const LayerImpact& l) { return bool(l.alone); });
    if (any) {
        m_upper = largest > 0 ? largest : 1.0;
        m_lower = std::min(largest > 0 ? smallest / 2 : 1e-6, m_upper / 10);
    }
    setVisible(any);
    updateGeometry();
    update();
}

QSize ImpactColumn::sizeHint() const
{
    return {kColumnWidth, 100};
}

double ImpactColumn::fromMap(double y) const
{
    return y + m_map->mapTo(m_map->window(), QPoint(0, 0)).y() - mapTo(window(), QPoint(0, 0)).y();
}

double ImpactColumn::toMap(double y) const
{
    return y - fromMap(0);
}

QRect ImpactColumn::axisBand() const
{
    const QRect axis = m_map->axisRect()->rect();
    return QRect(kPad, int(fromMap(axis.top())), width() - 2 * kPad, axis.height());
}

double ImpactColumn::klX(double kl) const
{
    const QRect band = axisBand();
    if (!(kl > 0) || !(m_lower > 0))
        return band.left();
    const double t = std::clamp(std::log(kl / m_lower) / std::log(m_upper / m_lower), 0.0, 1.0);
    return band.left() + t * band.width();
}

int ImpactColumn::rowAt(int y) const
{
    if (!axisBand().contains(QPoint(axisBand().left(), y)))
        return -1;
    const int row = int(std::floor(m_map->yAxis->pixelToCoord(toMap(y)) + 0.5));
    return row >= 0 && row < int(m_layers.size()) ? row : -1;
}

QRectF ImpactColumn::barRect(int row) const
{
    if (row < 0 || row >= int(m_layers.size()) || !m_layers[std::size_t(row)].alone)
        return {};
    const double top = fromMap(m_map->yAxis->coordToPixel(row - 0.5));
    const double bottom = fromMap(m_map->yAxis->coordToPixel(row + 0.5));
    const double height = std::abs(bottom - top);
    const double inset = height > 5 ? 1 : 0;  // rows apart while they are tall enough
    const double left = axisBand().left();
    return QRectF(left, std::min(top, bottom) + inset, std::max(1.0, klX(m_layers[std::size_t(row)].alone->klMax) - left),
                  height - 2 * inset);
}

QColor ImpactColumn::barColour(const LayerImpact& layer)
{
    switch (impactLevel(layer)) {
    case ImpactLevel::AboveNoise: {
        // In the map's ratio colours, the noise factor as its off threshold: 4x the noise is "off".
        QCPColorGradient gradient = colorGradient(ScaleKind::Ratio);
        const ValueRange range = defaultRange(ScaleKind::Ratio);
        const std::optional<double> ratio = noiseRatio(layer.alone, layer.aloneNoise);
        const double level = ratio ? *ratio / kImpactNoiseFactor : range.upper;  // (noise 0: beyond any ratio)
        return QColor::fromRgb(gradient.color(std::clamp(level, range.lower, range.upper), toQcpRange(range), true));
    }
    case ImpactLevel::WithinNoise:
        return kWithinNoise;
    case ImpactLevel::NoNoise:
        return kNoNoise;
    case ImpactLevel::None:
        break;
    }
    return {};
}

QString ImpactColumn::describeAt(int y) const
{
    const int row = rowAt(y);
    if (row < 0)
        return {};
    const LayerImpact& l = m_layers[std::size_t(row)];
    QStringList lines;
    for (const std::string& line : layerImpactLines(l))
        lines << QString::fromStdString(line).toHtmlEscaped();
    if (lines.isEmpty())
        lines << tr("no impact measured for this layer");
    else if (impactLevel(l) == ImpactLevel::NoNoise)
        lines << tr("no baseline's row: no noise to measure it against");
    return QString("<b>%1</b><br>%2").arg(QString::fromStdString(l.layer).toHtmlEscaped(), lines.join("<br>"));
}

void ImpactColumn::paintEvent(QPaintEvent*)
{
    if (m_layers.empty())
        return;
    QPainter painter(this);
    const QRect band = axisBand();
    const QFont small(font().family(), 8);
    painter.setFont(small);
    const int line = QFontMetrics(small).height();
    painter.setPen(palette().color(QPalette::WindowText));
    painter.drawText(QRect(0, band.top() - 2 * line - 2, width(), 2 * line), Qt::AlignHCenter | Qt::AlignBottom,
                     tr("output KL,\nlayer alone"));
    painter.fillRect(band, QColor("#f7f7f7"));
    painter.setClipRect(band);
    for (int r = 0; r < int(m_layers.size()); ++r) {
        const QRectF bar = barRect(r);
        if (bar.isEmpty() || bar.bottom() < band.top() || bar.top() > band.bottom())
            continue;
        const LayerImpact& l = m_layers[std::size_t(r)];
        painter.fillRect(bar, barColour(l));
        if (l.aloneNoise) {  // the noise: a dark tick across the row
            const double x = klX(l.aloneNoise->klMax);
            painter.setPen(QPen(QColor("#202020"), 2));
            painter.drawLine(QPointF(x, bar.top()), QPointF(x, bar.bottom()));
        }
    }
    painter.setClipping(false);
    painter.setPen(QColor("#a0a0a0"));
    painter.drawRect(band.adjusted(0, 0, -1, -1));
    // The scale, under it: its top, and what the tick is.
    painter.setPen(palette().color(QPalette::WindowText));
    const QRect under(0, band.bottom() + 2, width(), line);
    painter.drawText(under, Qt::AlignHCenter | Qt::AlignTop, tr("log, to %1").arg(QString::fromStdString(klText(m_upper))));
    painter.drawText(under.translated(0, line), Qt::AlignHCenter | Qt::AlignTop, tr("nats; | noise"));
}

void ImpactColumn::mouseMoveEvent(QMouseEvent* event)
{
    const QString text = describeAt(event->position().toPoint().y());
    if (text.isEmpty())
        QToolTip::hideText();
    else
        QToolTip::showText(event->globalPosition().toPoint(), text, this);
}

}  // namespace kvscope
