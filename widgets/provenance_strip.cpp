#include "widgets/provenance_strip.h"

#include "analysis/source_summary.h"
#include "widgets/heatmap_view.h"

#include <QMouseEvent>
#include <QPainter>
#include <QToolTip>

#include <cmath>

namespace kvscope {

ProvenanceStrip::ProvenanceStrip(HeatmapView* map, QWidget* parent) : QWidget(parent), m_map(map)
{
    setObjectName("provenanceStrip");
    setMouseTracking(true);
    setSizePolicy(QSizePolicy::Preferred, QSizePolicy::Fixed);
    hide();
    // The map's axis moves on zoom, pan and resize: each ends in a replot.
    connect(m_map, &QCustomPlot::afterReplot, this, qOverload<>(&QWidget::update));
}

void ProvenanceStrip::setProvenance(std::vector<ProvenanceRange> ranges)
{
    m_ranges = std::move(ranges);
    setVisible(!m_ranges.empty());
    updateGeometry();
    update();
}

QColor ProvenanceStrip::kindColour(ProvenanceKind kind)
{
    switch (kind) {  // distinct for the eye, none of them the map's off red
    case ProvenanceKind::Prefill:
        return QColor("#6b8fb8");
    case ProvenanceKind::PrefixCache:
        return QColor("#4dac26");
    case ProvenanceKind::External:
        return QColor("#e08214");
    case ProvenanceKind::Decode:
        return QColor("#c7c7c7");
    case ProvenanceKind::SpecAccepted:
        return QColor("#8073ac");
    case ProvenanceKind::Recomputed:
        return QColor("#8c510a");
    case ProvenanceKind::Unknown:
        break;
    }
    return QColor("#ffffff");
}

int ProvenanceStrip::bandHeight() const
{
    return std::max(8, fontMetrics().height() * 2 / 3);
}

QSize ProvenanceStrip::sizeHint() const
{
    return {200, bandHeight() + fontMetrics().height() + 6};
}

qint64 ProvenanceStrip::positionAt(int x) const
{
    const QRect axis = m_map->axisRect()->rect();
    if (m_ranges.empty() || x < axis.left() || x > axis.right())
        return -1;
    const double position = std::round(m_map->xAxis->pixelToCoord(x));
    return position < 0 ? -1 : qint64(position);
}

QString ProvenanceStrip::describeAt(qint64 position) const
{
    const ProvenanceRange* range = provenanceAt(m_ranges, position);
    if (!range)
        return tr("position %1: no source recorded").arg(position);
    return tr("position %1: %2").arg(position).arg(QString::fromStdString(describeProvenance({*range}).front()));
}

void ProvenanceStrip::paintEvent(QPaintEvent*)
{
    if (m_ranges.empty())
        return;
    QPainter painter(this);
    const QRect axis = m_map->axisRect()->rect();
    const int band = bandHeight();
    const QRect strip(axis.left(), 1, axis.width(), band);
    painter.setPen(palette().color(QPalette::WindowText));
    painter.drawText(QRect(0, 0, axis.left() - 6, band + 2), Qt::AlignRight | Qt::AlignVCenter, tr("KV from"));
    painter.setClipRect(strip);
    painter.fillRect(strip, kindColour(ProvenanceKind::Unknown));
    const auto pixel = [&](double position) { return m_map->xAxis->coordToPixel(position - 0.5); };
    std::string previous;
    for (const ProvenanceRange& r : m_ranges) {
        const double x0 = pixel(double(r.start)), x1 = pixel(double(r.end));
        painter.fillRect(QRectF(x0, strip.top(), x1 - x0, band), kindColour(r.kind));
        const std::string source = sourceOf(r);
        if (source != previous && r.start > 0) {  // where the source changes: a chunk or path boundary
            painter.setPen(QPen(QColor("#202020"), 1.5));
            painter.drawLine(QPointF(x0, strip.top()), QPointF(x0, strip.bottom()));
        }
        previous = source;
    }
    painter.setClipping(false);
    painter.setPen(QColor("#808080"));
    painter.drawRect(strip.adjusted(0, 0, -1, -1));

    // The legend: each kind present, once, in position order.
    std::vector<ProvenanceKind> kinds;
    std::vector<std::string> connectors;
    for (const ProvenanceRange& r : m_ranges) {
        if (std::find(kinds.begin(), kinds.end(), r.kind) == kinds.end())
            kinds.push_back(r.kind);
        if (!r.connector.empty() && std::find(connectors.begin(), connectors.end(), r.connector) == connectors.end())
            connectors.push_back(r.connector);
    }
    int x = axis.left();
    const int y = band + 4, swatch = fontMetrics().height() - 4;
    for (ProvenanceKind kind : kinds) {
        QString label = QString(provenanceKindName(kind)).replace('_', ' ');
        if (kind == ProvenanceKind::External && !connectors.empty()) {
            QStringList names;
            for (const std::string& c : connectors)
                names << QString::fromStdString(c);
            label += " (" + names.join(", ") + ")";
        }
        painter.fillRect(QRect(x, y + 2, swatch, swatch), kindColour(kind));
        painter.setPen(QColor("#808080"));
        painter.drawRect(QRect(x, y + 2, swatch, swatch));
        painter.setPen(palette().color(QPalette::WindowText));
        const int width = fontMetrics().horizontalAdvance(label);
        painter.drawText(QRect(x + swatch + 4, y, width + 2, fontMetrics().height()), Qt::AlignLeft | Qt::AlignVCenter, label);
        x += swatch + 4 + width + 14;
    }
}

void ProvenanceStrip::mouseMoveEvent(QMouseEvent* event)
{
    const qint64 position = positionAt(event->position().toPoint().x());
    if (position < 0)
        QToolTip::hideText();
    else
        QToolTip::showText(event->globalPosition().toPoint(), describeAt(position), this);
}

}  // namespace kvscope
