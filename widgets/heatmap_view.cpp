#include "widgets/heatmap_view.h"

#include "widgets/plot_decorations.h"

#include <cmath>

namespace kvscope {

HeatmapView::HeatmapView(QWidget* parent)
    : QCustomPlot(parent)
{
    setMinimumSize(400, 250);
    m_title = addPlotTitle(this, 10);

    m_map = new QCPColorMap(xAxis, yAxis);
    m_map->setInterpolate(false);
    m_map->setTightBoundary(true);
    m_scale = new QCPColorScale(this);
    plotLayout()->addElement(1, 1, m_scale);
    m_scale->setType(QCPAxis::atRight);
    m_map->setColorScale(m_scale);
    auto* margins = new QCPMarginGroup(this);
    axisRect()->setMarginGroup(QCP::msBottom | QCP::msTop, margins);
    m_scale->setMarginGroup(QCP::msBottom | QCP::msTop, margins);

    // Absent cells are transparent over this: hatched grey, never a colour of the scale.
    axisRect()->setBackground(QBrush(QColor(150, 150, 150), Qt::BDiagPattern));
    yAxis->setRangeReversed(true);  // layer 0 at the top
    yAxis->setTicker(QSharedPointer<QCPAxisTickerText>(new QCPAxisTickerText));
    xAxis->setLabel("token");
    xAxis2->setVisible(false);
    setInteractions(QCP::iRangeDrag | QCP::iRangeZoom);
    axisRect()->setRangeZoom(Qt::Horizontal | Qt::Vertical);

    m_selection = new QCPItemRect(this);
    m_selection->setPen(QPen(Qt::black, 2));
    m_selection->setBrush(Qt::NoBrush);
    m_selection->setVisible(false);
    m_selection->setLayer("overlay");

    connect(xAxis, qOverload<const QCPRange&>(&QCPAxis::rangeChanged), this, [this](const QCPRange& r) {
        updateTokenTicks();
        emit visibleTokensChanged(r.lower, r.upper);
    });
    connect(yAxis, qOverload<const QCPRange&>(&QCPAxis::rangeChanged), this, [this] { updateRowTicks(); });
    setScale(ScaleKind::Error, toQcpRange(defaultRange(ScaleKind::Error)), false);
}

void HeatmapView::setGrid(const HeatmapGrid& grid)
{
    m_grid = grid;
    const double first = double(grid.firstToken);
    const double step = double(grid.tokensPerColumn);
    auto* data = new QCPColorMapData(int(std::max<std::int64_t>(grid.columns, 1)), std::max(grid.rows, 1),
                                     QCPRange(first + (step - 1) / 2, first + (double(grid.columns) - 0.5) * step - 0.5),
                                     QCPRange(0, std::max(grid.rows - 1, 0)));
    if (grid.columns == 1)
        data->setKeyRange(QCPRange(first + (step - 1) / 2 - 0.5, first + (step - 1) / 2 + 0.5));
    if (grid.rows == 1)
        data->setValueRange(QCPRange(-0.5, 0.5));
    for (int r = 0; r < grid.rows; ++r)
        for (std::int64_t c = 0; c < grid.columns; ++c)
            data->setCell(int(c), r, double(grid.at(r, c)));
    m_map->setData(data);  // takes ownership
    replot(QCustomPlot::rpQueuedReplot);
}

void HeatmapView::setRowLabels(const QStringList& labels)
{
    m_rowLabels = labels;
    updateRowTicks();
}

void HeatmapView::updateRowTicks()
{
    auto ticker = qSharedPointerCast<QCPAxisTickerText>(yAxis->ticker());
    ticker->clear();
    // Every label while they fit the visible rows, else every k-th.
    const double rows = std::max(1.0, yAxis->range().size());
    const int lineHeight = QFontMetrics(yAxis->tickLabelFont()).height();
    const int every = std::max(1, int(std::ceil(rows * lineHeight / std::max(axisRect()->height(), 50))));
    for (int i = 0; i < m_rowLabels.size(); i += every)
        ticker->addTick(i, m_rowLabels[i]);
    replot(QCustomPlot::rpQueuedReplot);
}

void HeatmapView::resizeEvent(QResizeEvent* event)
{
    QCustomPlot::resizeEvent(event);
    updateRowTicks();
}

void HeatmapView::setTokenLabels(const QStringList& labels)
{
    m_tokenLabels = labels;
    updateTokenTicks();
}

void HeatmapView::updateTokenTicks()
{
    // Token text on the axis once few enough tokens are visible to read it.
    const QCPRange r = xAxis->range();
    if (!m_tokenLabels.isEmpty() && r.size() < 40) {
        QSharedPointer<QCPAxisTickerText> ticker(new QCPAxisTickerText);
        for (int t = std::max(0, int(std::ceil(r.lower))); t <= int(r.upper) && t < m_tokenLabels.size(); ++t)
            ticker->addTick(t, QString("%1\n%2").arg(t).arg(m_tokenLabels[t].left(10)));
        xAxis->setTicker(ticker);
    } else if (qSharedPointerDynamicCast<QCPAxisTickerText>(xAxis->ticker())) {
        xAxis->setTicker(QSharedPointer<QCPAxisTicker>(new QCPAxisTicker));
    }
}

void HeatmapView::showMap(const MapSpec& spec)
{
    QStringList rows, tokens;
    for (const std::string& r : spec.rowLabels)
        rows << QString::fromStdString(r);
    for (const std::string& t : spec.tokenText)
        tokens << QString::fromStdString(t);
    setRowLabels(rows);
    setTokenLabels(tokens);
    QVector<double> divergences;
    for (std::int64_t d : spec.divergences)
        divergences << double(d);
    setMarkers(spec.prefillBoundary, divergences);
    QVector<double> at;
    QStringList labels;
    for (const auto& [x, label] : spec.topLabels)
        at << double(x), labels << QString::fromStdString(label);
    setTopLabels(at, labels);
    setTitle(QString::fromStdString(spec.title));
    xAxis->setLabel(QString::fromStdString(spec.xLabel));
    setScale(spec.scale, toQcpRange(spec.range), false);
}

void HeatmapView::setMarkers(double prefillBoundary, const QVector<double>& divergences)
{
    setTokenMarkers(this, m_markers, prefillBoundary, divergences);
    replot(QCustomPlot::rpQueuedReplot);
}

void HeatmapView::setScale(ScaleKind kind, QCPRange range, bool logarithmic)
{
    m_map->setGradient(colorGradient(kind));
    const QCPAxis::ScaleType type = logarithmic ? QCPAxis::stLogarithmic : QCPAxis::stLinear;
    m_map->setDataScaleType(type);
    m_scale->axis()->setScaleType(type);
    if (logarithmic) {
        m_scale->axis()->setTicker(QSharedPointer<QCPAxisTickerLog>(new QCPAxisTickerLog));
        range.lower = std::max(range.lower, range.upper * 1e-6);
    } else {
        m_scale->axis()->setTicker(QSharedPointer<QCPAxisTicker>(new QCPAxisTicker));
    }
    m_map->setDataRange(range);
    replot(QCustomPlot::rpQueuedReplot);
}

void HeatmapView::setTitle(const QString& title)
{
    m_title->setText(title);
    replot(QCustomPlot::rpQueuedReplot);
}

void HeatmapView::setSelection(int row, qint64 token)
{
    m_selection->setVisible(row >= 0);
    if (row >= 0) {
        m_selection->topLeft->setCoords(double(token) - 0.5, row - 0.5);
        m_selection->bottomRight->setCoords(double(token) + 0.5, row + 0.5);
    }
    replot(QCustomPlot::rpQueuedReplot);
}

void HeatmapView::setTopLabels(const QVector<double>& positions, const QStringList& labels)
{
    QSharedPointer<QCPAxisTickerText> ticker(new QCPAxisTickerText);
    for (int i = 0; i < positions.size() && i < labels.size(); ++i)
        ticker->addTick(positions[i], labels[i]);
    xAxis2->setTicker(ticker);
    xAxis2->setVisible(!positions.isEmpty());
    xAxis2->setTickLabelRotation(-60);
    xAxis2->setTickLabelFont(QFont(font().family(), 7));
    connect(xAxis, qOverload<const QCPRange&>(&QCPAxis::rangeChanged), xAxis2, qOverload<const QCPRange&>(&QCPAxis::setRange),
            Qt::UniqueConnection);
    xAxis2->setRange(xAxis->range());
    replot(QCustomPlot::rpQueuedReplot);
}

void HeatmapView::resetView(qint64 tokens, int rows)
{
    xAxis->setRange(-0.5, double(std::max<qint64>(tokens, 1)) - 0.5);
    yAxis->setRange(-0.5, double(std::max(rows, 1)) - 0.5);
    updateRowTicks();
}

bool HeatmapView::cellAt(const QPoint& pos, int& row, qint64& token) const
{
    if (!axisRect()->rect().contains(pos))
        return false;
    const double x = xAxis->pixelToCoord(pos.x()), y = yAxis->pixelToCoord(pos.y());
    row = int(std::floor(y + 0.5));
    token = qint64(std::floor(x + 0.5));
    const qint64 lastToken = m_grid.firstToken + m_grid.columns * m_grid.tokensPerColumn;
    return row >= 0 && row < m_grid.rows && token >= m_grid.firstToken && token < lastToken;
}

void HeatmapView::mousePressEvent(QMouseEvent* event)
{
    m_pressPos = event->pos();
    QCustomPlot::mousePressEvent(event);
    int row;
    qint64 token;
    if (event->button() == Qt::LeftButton && cellAt(event->pos(), row, token))
        emit cellClicked(row, token);
}

void HeatmapView::mouseMoveEvent(QMouseEvent* event)
{
    QCustomPlot::mouseMoveEvent(event);
    int row;
    qint64 token;
    if (!(event->buttons() & Qt::LeftButton) && cellAt(event->pos(), row, token))
        emit cellHovered(row, token, event->globalPosition().toPoint());
}

}  // namespace kvscope
