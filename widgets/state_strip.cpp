#include "widgets/state_strip.h"

#include "analysis/map_spec.h"
#include "widgets/color_scales.h"
#include "widgets/heatmap_view.h"

#include <QMouseEvent>
#include <QPainter>
#include <QToolTip>

#include <cmath>

namespace kvscope {

StateStrip::StateStrip(HeatmapView* map, QWidget* parent) : QWidget(parent), m_map(map)
{
    setObjectName("stateStrip");
    setMouseTracking(true);
    setSizePolicy(QSizePolicy::Preferred, QSizePolicy::Fixed);
    hide();
    connect(m_map, &QCustomPlot::afterReplot, this, qOverload<>(&QWidget::update));
}

void StateStrip::setStates(std::vector<StateRow> rows, std::vector<StateLayerAnalysis> states)
{
    m_rows = std::move(rows);
    m_states = std::move(states);
    setVisible(!m_rows.empty());
    updateGeometry();
    update();
}

int StateStrip::rowHeight() const
{
    return std::max(9, fontMetrics().height() * 3 / 4);
}

int StateStrip::titleHeight() const
{
    return fontMetrics().height() + 2;
}

QSize StateStrip::sizeHint() const
{
    return {200, titleHeight() + rowHeight() * std::max(1, int(m_rows.size())) + 4};
}

int StateStrip::rowAt(int y) const
{
    const int row = (y - titleHeight()) / rowHeight();
    return y < titleHeight() || row >= int(m_rows.size()) ? -1 : row;
}

const StateRowCell* StateStrip::cellAt(const QPoint& at, int* row) const
{
    *row = rowAt(at.y());
    const QRect axis = m_map->axisRect()->rect();
    if (*row < 0 || at.x() < axis.left() || at.x() > axis.right())
        return nullptr;
    // Within the few pixels a cell is drawn at least as wide as.
    const double token = m_map->xAxis->pixelToCoord(at.x());
    const double tokensPerPixel = std::abs(m_map->xAxis->pixelToCoord(at.x() + 1) - token);
    return stateCellNear(m_rows[std::size_t(*row)], std::llround(token), std::max<std::int64_t>(1, std::llround(4 * tokensPerPixel)));
}

QString StateStrip::describeAt(const QPoint& at) const
{
    int row = -1;
    if (const StateRowCell* cell = cellAt(at, &row))
        return QString::fromStdString(stateCellText(m_states[std::size_t(row)], cell->checkpoint));
    if (row >= 0 && !m_rows[std::size_t(row)].problem.empty())
        return QString::fromStdString(m_rows[std::size_t(row)].layer + ": not compared: " + m_rows[std::size_t(row)].problem);
    return {};
}

void StateStrip::paintEvent(QPaintEvent*)
{
    if (m_rows.empty())
        return;
    QPainter painter(this);
    const QRect axis = m_map->axisRect()->rect();
    const int rowH = rowHeight(), top = titleHeight();
    painter.setPen(palette().color(QPalette::WindowText));
    painter.drawText(QRect(axis.left(), 0, axis.width(), top), Qt::AlignLeft | Qt::AlignVCenter,
                     tr("Recurrent state, per state-space layer: a cell per checkpoint (the map's colours)"));
    QCPColorGradient gradient = colorGradient(ScaleKind::Ratio);  // (its color() is not const)
    const ValueRange range = defaultRange(ScaleKind::Ratio);
    const auto pixel = [&](double token) { return m_map->xAxis->coordToPixel(token); };
    const double tokenWidth = std::abs(pixel(1.0) - pixel(0.0));
    for (std::size_t r = 0; r < m_rows.size(); ++r) {
        const StateRow& row = m_rows[r];
        const QRect band(axis.left(), top + int(r) * rowH, axis.width(), rowH - 2);
        painter.setClipping(false);
        painter.setPen(palette().color(QPalette::WindowText));
        painter.setFont(m_map->yAxis->tickLabelFont());  // as the map's rows are labelled
        const QString label =
            QFontMetrics(painter.font()).elidedText(QString::fromStdString(row.label), Qt::ElideLeft, axis.left() - 8);
        painter.drawText(QRect(0, band.top(), axis.left() - 6, rowH), Qt::AlignRight | Qt::AlignVCenter, label);
        painter.setClipRect(band);
        painter.fillRect(band, QColor("#f4f4f4"));
        if (!row.problem.empty()) {
            painter.setPen(QColor("#808080"));
            painter.drawText(band, Qt::AlignCenter, tr("not compared: %1").arg(QString::fromStdString(row.problem)));
        }
        for (const StateRowCell& cell : row.cells) {
            // At least 5 pixels wide: a checkpoint is one token among thousands.
            const double width = std::max(5.0, tokenWidth);
            const double x = pixel(double(cell.token)) - width / 2;
            const QColor colour = std::isfinite(cell.offs)
                                      ? QColor::fromRgb(gradient.color(std::clamp(cell.offs, range.lower, range.upper),
                                                                       toQcpRange(range), true))
                                      : QColor("#ffffff");
            painter.fillRect(QRectF(x, band.top(), width, band.height()), colour);
            painter.setPen(QColor("#606060"));
            painter.drawRect(QRectF(x, band.top(), width, band.height()));
        }
        painter.setClipping(false);
        painter.setPen(QColor("#a0a0a0"));
        painter.drawRect(band.adjusted(0, 0, -1, -1));
    }
}

void StateStrip::mouseMoveEvent(QMouseEvent* event)
{
    const QString text = describeAt(event->position().toPoint());
    if (text.isEmpty())
        QToolTip::hideText();
    else
        QToolTip::showText(event->globalPosition().toPoint(), text, this);
}

void StateStrip::mousePressEvent(QMouseEvent* event)
{
    int row = -1;
    const StateRowCell* cell = cellAt(event->position().toPoint(), &row);
    if (!cell)
        return;
    const StateLayerAnalysis& a = m_states[std::size_t(row)];
    int part = 0;
    std::int64_t worst = 0;
    a.worstRatio(cell->checkpoint, &part, &worst);
    emit checkpointClicked(QString::fromStdString(stateCellText(a, cell->checkpoint)), QString::fromStdString(a.layer),
                           a.positions[cell->checkpoint], QString::fromStdString(a.parts[std::size_t(part)].name), worst);
}

}  // namespace kvscope
