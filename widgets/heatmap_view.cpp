#include "widgets/heatmap_view.h"

#include "widgets/integer_ticker.h"

#include "widgets/plot_decorations.h"

#include <QApplication>
#include <QTimer>

#include <algorithm>
#include <optional>

#include <cmath>

namespace kvscope {

HeatmapView::HeatmapView(QWidget* parent)
    : QCustomPlot(parent)
    , m_clickTimer(new QTimer(this))
{
    // A double-click resets the zoom and nothing else: its first click must not select.
    m_clickTimer->setSingleShot(true);
    m_clickTimer->setInterval(QApplication::doubleClickInterval());
    connect(m_clickTimer, &QTimer::timeout, this, &HeatmapView::emitPendingClick);
    setMinimumSize(400, 190);  // (with the Compare page's verdict and line plot, within a 700-pixel screen)
    m_title = addPlotTitle(this, 10);

    m_map = new QCPColorMap(xAxis, yAxis);
    m_map->setInterpolate(false);
    m_map->setTightBoundary(false);  // edge cells as wide as the others
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
    yAxis->setTickLabelFont(QFont(font().family(), 8));
    xAxis->setLabel("token");
    xAxis->setTicker(QSharedPointer<QCPAxisTicker>(new IntegerAxisTicker));  // tokens, generation indices
    xAxis2->setVisible(false);
    setInteractions(QCP::iRangeDrag | QCP::iRangeZoom);
    axisRect()->setRangeZoom(Qt::Horizontal | Qt::Vertical);

    m_selection = new QCPItemRect(this);
    m_selection->setPen(QPen(Qt::black, 2));
    m_selection->setBrush(Qt::NoBrush);
    m_selection->setVisible(false);
    m_selection->setLayer("overlay");

    m_highlight = new QCPItemRect(this);
    m_highlight->setPen(QPen(QColor(0, 90, 255), 2, Qt::DashLine));
    m_highlight->setBrush(QColor(0, 90, 255, 25));
    m_highlight->setVisible(false);
    m_highlight->setLayer("overlay");

    m_emptyText = new QCPItemText(this);
    m_emptyText->position->setType(QCPItemPosition::ptAxisRectRatio);
    m_emptyText->position->setCoords(0.5, 0.45);
    m_emptyText->setFont(QFont(font().family(), 11));
    m_emptyText->setColor(QColor(90, 90, 90));
    m_emptyText->setLayer("overlay");

    setFocusPolicy(Qt::StrongFocus);  // reachable with Tab; arrows move the selection
    connect(xAxis, qOverload<const QCPRange&>(&QCPAxis::rangeChanged), this, [this](const QCPRange& r) {
        clampRange(xAxis, m_fullX);
        if (xAxis->range() != r)
            return;  // clamped: the signal comes again with the final range
        updateTokenTicks();
        emit visibleTokensChanged(r.lower, r.upper);
    });
    connect(yAxis, qOverload<const QCPRange&>(&QCPAxis::rangeChanged), this, [this](const QCPRange& r) {
        clampRange(yAxis, m_fullY);
        if (yAxis->range() == r)
            updateRowTicks();
    });
    setScale(ScaleKind::Error, toQcpRange(defaultRange(ScaleKind::Error)), false);
    showEmpty(tr("Nothing open"));
}

void HeatmapView::clampRange(QCPAxis* axis, const QCPRange& full)
{
    // Zoomed out no further than the data, panned no further than its edges, zoomed in no
    // further than a few cells.
    QCPRange r = axis->range();
    const double smallest = std::min(full.size(), axis == xAxis ? 4.0 : 1.0);
    if (r.size() < smallest)
        r = QCPRange(r.center() - smallest / 2, r.center() + smallest / 2);
    if (r.size() >= full.size()) {
        r = full;
    } else if (r.lower < full.lower) {
        r += full.lower - r.lower;
    } else if (r.upper > full.upper) {
        r -= r.upper - full.upper;
    }
    if (r != axis->range())
        axis->setRange(r);
}

void HeatmapView::showEmpty(const QString& message)
{
    m_empty = true;
    m_grid = {};
    m_map->data()->clear();
    m_map->setVisible(false);
    m_scale->setVisible(false);
    m_selection->setVisible(false);
    m_highlight->setVisible(false);
    setTokenMarkers(this, m_markers, std::nan(""), {});
    setPendingRows({}, {});
    m_rowLabels.clear();
    m_tokenLabels.clear();
    updateRowTicks();
    setTopLabels({}, {});
    setAxesVisible(this, false);
    axisRect()->setBackground(Qt::NoBrush);
    m_titleText.clear();
    m_title->setText(QString());
    setSuspectRows(-1, {}, {});
    m_emptyMessage = message;
    m_emptyText->setText(wrappedToWidth(message, m_emptyText->font(), emptyTextWidth()));
    m_emptyText->setVisible(true);
    replot(QCustomPlot::rpQueuedReplot);
}

void HeatmapView::setPendingRows(const std::vector<char>& ready, const QString& label, int startedRow, qint64 startedTokens)
{
    for (QCPAbstractItem* item : std::as_const(m_pending))
        removeItem(item);
    m_pending.clear();
    // A cover of rows [first, last] from token x on (from the left edge without), to the right
    // edge; the label in its middle when it is whole rows (a started row's rest is often too
    // narrow for it, and its colour says what it is).
    const auto cover = [&](std::optional<double> x, std::size_t first, std::size_t last) {
        auto* rect = new QCPItemRect(this);
        for (QCPItemPosition* corner : {rect->topLeft, rect->bottomRight}) {
            corner->setTypeX(QCPItemPosition::ptAxisRectRatio);
            corner->setTypeY(QCPItemPosition::ptPlotCoords);
        }
        if (x)
            rect->topLeft->setTypeX(QCPItemPosition::ptPlotCoords);  // (past the right edge it draws nothing)
        rect->topLeft->setCoords(x.value_or(0), double(first) - 0.5);
        rect->bottomRight->setCoords(1, double(last) + 0.5);
        rect->setPen(Qt::NoPen);
        rect->setBrush(QColor(235, 235, 240));
        m_pending << rect;
        if (x)
            return;
        auto* text = new QCPItemText(this);
        text->position->setTypeX(QCPItemPosition::ptAxisRectRatio);
        text->position->setTypeY(QCPItemPosition::ptPlotCoords);
        text->position->setCoords(0.5, (double(first) + double(last)) / 2);
        text->setText(label);
        text->setColor(QColor(80, 80, 100));
        text->setFont(QFont(font().family(), 8, -1, true));
        m_pending << text;
    };
    // One cover per run of rows that are not ready (a started row apart).
    const auto pending = [&](std::size_t row) { return !ready[row] && int(row) != startedRow; };
    for (std::size_t first = 0; first < ready.size();) {
        if (!pending(first)) {
            ++first;
            continue;
        }
        std::size_t last = first;
        while (last + 1 < ready.size() && pending(last + 1))
            ++last;
        cover(std::nullopt, first, last);
        first = last + 1;
    }
    if (startedRow >= 0 && std::size_t(startedRow) < ready.size() && !ready[std::size_t(startedRow)])
        cover(double(startedTokens) - 0.5, std::size_t(startedRow), std::size_t(startedRow));
    replot(QCustomPlot::rpQueuedReplot);
}

void HeatmapView::leaveEmpty()
{
    if (!m_empty)
        return;
    m_empty = false;
    m_emptyText->setVisible(false);
    m_map->setVisible(true);
    m_scale->setVisible(true);
    setAxesVisible(this, true);
    legend->setVisible(false);
    axisRect()->setBackground(QBrush(QColor(150, 150, 150), Qt::BDiagPattern));
}

void HeatmapView::setGrid(const HeatmapGrid& grid)
{
    leaveEmpty();
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

void HeatmapView::setPinnedRows(const QList<int>& rows)
{
    if (rows == m_pinnedRows)
        return;
    m_pinnedRows = rows;
    updateRowTicks();
}

void HeatmapView::updateRowTicks()
{
    auto ticker = qSharedPointerCast<QCPAxisTickerText>(yAxis->ticker());
    ticker->clear();
    // Every label while they fit the visible rows, else every k-th; the pinned rows always,
    // and no other label closer to them than k rows (they would overlap).
    const double rows = std::max(1.0, yAxis->range().size());
    const int lineHeight = QFontMetrics(yAxis->tickLabelFont()).height();
    const int every = std::max(1, int(std::ceil(rows * lineHeight / std::max(axisRect()->height(), 50))));
    QList<int> pinned;
    for (int row : m_pinnedRows)
        if (row >= 0 && row < m_rowLabels.size() && !pinned.contains(row))
            pinned << row;
    for (int i = 0; i < m_rowLabels.size(); i += every)
        if (std::none_of(pinned.begin(), pinned.end(), [&](int p) { return std::abs(p - i) < every; }))
            ticker->addTick(i, m_rowLabels[i]);
    for (int row : pinned)
        ticker->addTick(row, m_rowLabels[row]);
    replot(QCustomPlot::rpQueuedReplot);
}

int HeatmapView::emptyTextWidth() const
{
    // The axis rect as last laid out (the hidden colour scale still takes its column), and never
    // wider than the widget now (a resize lays it out again only at the next replot).
    const QMargins margins = axisRect()->margins();
    return std::max(200, std::min(axisRect()->width(), width() - margins.left() - margins.right()) - 40);
}

void HeatmapView::resizeEvent(QResizeEvent* event)
{
    QCustomPlot::resizeEvent(event);
    wrapTitle();
    updateRowTicks();
    updateTokenTicks();
    if (m_empty)
        m_emptyText->setText(wrappedToWidth(m_emptyMessage, m_emptyText->font(), emptyTextWidth()));
}

void HeatmapView::setTokenLabels(const QStringList& labels)
{
    m_tokenLabels = labels;
    updateTokenTicks();
}

void HeatmapView::updateTokenTicks()
{
    // Token text on the axis once few enough tokens are visible to read it: every k-th token,
    // k such that the widest of the labels fits the room k tokens have, so none run together.
    const QCPRange r = xAxis->range();
    if (!m_tokenLabels.isEmpty() && r.size() < 40) {
        const int first = std::max(0, int(std::ceil(r.lower)));
        const int last = std::min(int(r.upper), int(m_tokenLabels.size()) - 1);
        const QFontMetrics metrics(xAxis->tickLabelFont());
        QStringList labels;
        int widest = 0;
        for (int t = first; t <= last; ++t) {
            labels << QString("%1\n%2").arg(t).arg(m_tokenLabels[t].left(10));
            for (const QString& line : labels.back().split('\n'))
                widest = std::max(widest, metrics.horizontalAdvance(line));
        }
        const double perToken = double(std::max(axisRect()->width(), 1)) / std::max(r.size(), 1.0);
        const int every = std::max(1, int(std::ceil((widest + metrics.averageCharWidth()) / perToken)));
        QSharedPointer<QCPAxisTickerText> ticker(new QCPAxisTickerText);
        for (int t = first - first % every; t <= last; t += every)
            if (t >= first)
                ticker->addTick(t, labels[t - first]);
        xAxis->setTicker(ticker);
    } else if (qSharedPointerDynamicCast<QCPAxisTickerText>(xAxis->ticker())) {
        xAxis->setTicker(QSharedPointer<QCPAxisTicker>(new IntegerAxisTicker));
    }
}

void HeatmapView::showMap(const MapSpec& spec)
{
    leaveEmpty();  // before the labels, which are laid out for a visible map
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
    setSuspectRows(spec.onsetRow, spec.spreadRows, QString::fromStdString(spec.spreadLabel));
    setScale(spec.scale, toQcpRange(spec.range), false);
}

void HeatmapView::setSuspectRows(int onsetRow, const std::vector<int>& spreadRows, const QString& label)
{
    for (QCPAbstractItem* item : std::as_const(m_suspectMarks))
        removeItem(item);
    m_suspectMarks.clear();
    m_spreadRows = QList<int>(spreadRows.begin(), spreadRows.end());
    m_spreadLabel = label;
    // A rectangle over rows [first, last], the map's whole width.
    const auto rowsRect = [&](int first, int last) {
        auto* rect = new QCPItemRect(this);
        for (QCPItemPosition* corner : {rect->topLeft, rect->bottomRight}) {
            corner->setTypeX(QCPItemPosition::ptAxisRectRatio);
            corner->setTypeY(QCPItemPosition::ptPlotCoords);
        }
        rect->topLeft->setCoords(0, double(first) - 0.5);
        rect->bottomRight->setCoords(1, double(last) + 0.5);
        m_suspectMarks << rect;
        return rect;
    };
    // Dimmed, not hidden: the spread's colours still read, paler than the onset's. One label,
    // on the longest run of spread rows (scattered rows would stack labels).
    QList<int> rows = m_spreadRows;
    std::sort(rows.begin(), rows.end());
    int labelFirst = -1, labelLast = -1;
    for (qsizetype i = 0; i < rows.size();) {
        qsizetype j = i;
        while (j + 1 < rows.size() && rows[j + 1] == rows[j] + 1)
            ++j;
        QCPItemRect* cover = rowsRect(rows[i], rows[j]);
        cover->setPen(Qt::NoPen);
        cover->setBrush(QColor(255, 255, 255, 140));
        if (labelFirst < 0 || rows[j] - rows[i] > labelLast - labelFirst)
            labelFirst = rows[i], labelLast = rows[j];
        i = j + 1;
    }
    if (labelFirst >= 0) {
        auto* text = new QCPItemText(this);
        text->position->setTypeX(QCPItemPosition::ptAxisRectRatio);
        text->position->setTypeY(QCPItemPosition::ptPlotCoords);
        text->position->setCoords(0.995, (double(labelFirst) + double(labelLast)) / 2);
        text->setPositionAlignment(Qt::AlignRight | Qt::AlignVCenter);
        text->setText(label);
        text->setColor(QColor(60, 60, 80));
        text->setBrush(QColor(255, 255, 255, 200));
        text->setFont(QFont(font().family(), 8, -1, true));
        m_suspectMarks << text;
    }
    if (onsetRow >= 0) {
        QCPItemRect* frame = rowsRect(onsetRow, onsetRow);
        frame->setPen(QPen(QColor(70, 70, 90), 2));  // (not the prefill line's black)
        frame->setBrush(Qt::NoBrush);
    }
    replot(QCustomPlot::rpQueuedReplot);
}

void HeatmapView::setMarkers(double prefillBoundary, const QVector<double>& divergences)
{
    setTokenMarkers(this, m_markers, prefillBoundary, divergences);
    replot(QCustomPlot::rpQueuedReplot);
}

void HeatmapView::setScale(ScaleKind kind, QCPRange range, bool logarithmic)
{
    m_map->setGradient(colorGradient(kind));
    logarithmic = logarithmic || kind == ScaleKind::Ratio;  // (its stops are placed on a log scale)
    const QCPAxis::ScaleType type = logarithmic ? QCPAxis::stLogarithmic : QCPAxis::stLinear;
    m_map->setDataScaleType(type);
    m_scale->axis()->setScaleType(type);
    // A scale with words says them ("noise", "off", "10x off"); the others show numbers.
    if (const auto words = legendWords(kind); !words.empty()) {
        QSharedPointer<QCPAxisTickerText> ticker(new QCPAxisTickerText);
        for (const auto& [at, word] : words)
            ticker->addTick(at, QString::fromStdString(word));
        m_scale->axis()->setTicker(ticker);
        m_scale->axis()->setLabel(tr(legendTitle(kind)));
    } else {
        m_scale->axis()->setTicker(logarithmic ? QSharedPointer<QCPAxisTicker>(new QCPAxisTickerLog)
                                               : QSharedPointer<QCPAxisTicker>(new QCPAxisTicker));
        m_scale->axis()->setLabel({});
    }
    if (logarithmic)
        range.lower = std::max(range.lower, range.upper * 1e-6);
    m_map->setDataRange(range);
    replot(QCustomPlot::rpQueuedReplot);
}

void HeatmapView::setTitle(const QString& title)
{
    m_titleText = title;
    wrapTitle();
    replot(QCustomPlot::rpQueuedReplot);
}

void HeatmapView::wrapTitle()
{
    // Wrapped to the map's column: a title wider than it would take the colour scale's room
    // (the layout gives each column at least its widest element), and the scale would vanish.
    const int scaleRoom = m_scale->visible() ? 130 : 0;
    setWrappedTitle(m_title, m_titleText, std::max(200, width() - scaleRoom - 20));
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

void HeatmapView::setHighlight(const QVector<double>& corners)
{
    m_highlight->setVisible(corners.size() == 4);
    if (corners.size() == 4) {
        m_highlight->topLeft->setCoords(corners[0], corners[1]);
        m_highlight->bottomRight->setCoords(corners[2], corners[3]);
    }
    replot(QCustomPlot::rpQueuedReplot);
}

bool HeatmapView::hasHighlight() const
{
    return m_highlight->visible();
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
    m_fullX = QCPRange(-0.5, double(std::max<qint64>(tokens, 1)) - 0.5);
    m_fullY = QCPRange(-0.5, double(std::max(rows, 1)) - 0.5);
    resetZoom();
}

void HeatmapView::resetZoom()
{
    xAxis->setRange(m_fullX);
    yAxis->setRange(m_fullY);
    updateRowTicks();
}

void HeatmapView::ensureVisible(int row, qint64 token)
{
    const QCPRange x = xAxis->range(), y = yAxis->range();
    const double t = double(token);
    if (t - 0.5 < x.lower)
        xAxis->setRange(x + (t - 0.5 - x.lower));
    else if (t + 0.5 > x.upper)
        xAxis->setRange(x + (t + 0.5 - x.upper));
    if (row - 0.5 < y.lower)
        yAxis->setRange(y + (row - 0.5 - y.lower));
    else if (row + 0.5 > y.upper)
        yAxis->setRange(y + (row + 0.5 - y.upper));
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
    m_pressed = event->button() == Qt::LeftButton;
    QCustomPlot::mousePressEvent(event);  // starts a pan
}

void HeatmapView::mouseReleaseEvent(QMouseEvent* event)
{
    QCustomPlot::mouseReleaseEvent(event);
    // A click selects; a drag only pans.
    const bool click = m_pressed && event->button() == Qt::LeftButton &&
                       (event->pos() - m_pressPos).manhattanLength() < QApplication::startDragDistance();
    m_pressed = false;
    int row;
    qint64 token;
    if (click && cellAt(event->pos(), row, token)) {
        m_clickRow = row;
        m_clickToken = token;
        m_clickTimer->start();
    }
}

void HeatmapView::emitPendingClick()
{
    emit cellClicked(m_clickRow, m_clickToken);
}

void HeatmapView::mouseDoubleClickEvent(QMouseEvent* event)
{
    QCustomPlot::mouseDoubleClickEvent(event);
    if (event->button() == Qt::LeftButton) {
        m_clickTimer->stop();  // the first click of the two does not select
        m_pressed = false;     // nor does the release that follows
        resetZoom();
    }
}

void HeatmapView::mouseMoveEvent(QMouseEvent* event)
{
    QCustomPlot::mouseMoveEvent(event);
    int row;
    qint64 token;
    if (!(event->buttons() & Qt::LeftButton) && cellAt(event->pos(), row, token))
        emit cellHovered(row, token, event->globalPosition().toPoint());
}

void HeatmapView::keyPressEvent(QKeyEvent* event)
{
    switch (event->key()) {
    case Qt::Key_Home:
        resetZoom();
        return;
    case Qt::Key_Left:
    case Qt::Key_Right:
    case Qt::Key_Up:
    case Qt::Key_Down:
    case Qt::Key_Return:
    case Qt::Key_Enter:
    case Qt::Key_Escape:
        if (!m_empty) {
            emit keyPressed(event->key());
            return;
        }
        break;
    default:
        break;
    }
    QCustomPlot::keyPressEvent(event);
}

void HeatmapView::contextMenuEvent(QContextMenuEvent* event)
{
    emit contextMenuRequested(event->globalPos());
}

void HeatmapView::paintEvent(QPaintEvent* event)
{
    QCustomPlot::paintEvent(event);
    if (hasFocus()) {  // where the keyboard goes
        QPainter painter(this);
        painter.setPen(QPen(palette().color(QPalette::Highlight), 2));
        painter.drawRect(rect().adjusted(1, 1, -1, -1));
    }
}

void HeatmapView::focusInEvent(QFocusEvent* event)
{
    QCustomPlot::focusInEvent(event);
    update();
}

void HeatmapView::focusOutEvent(QFocusEvent* event)
{
    QCustomPlot::focusOutEvent(event);
    update();
}

}  // namespace kvscope
