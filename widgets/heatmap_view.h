#pragma once
// A layer x token heatmap (QCustomPlot colour map with a colour scale): layer names on the Y
// axis, tokens on X, the prefill/decode boundary and divergence markers, absent cells hatched
// grey, rows not analysed (yet) covered and labelled, the selected cell outlined, an empty
// state that says what to do. Zoom (wheel) and pan (drag) stay within the data; a click
// without movement selects (once it is not the first of a double-click); double-click, Home
// and the context menu reset the view.

#include "widgets/color_scales.h"
#include "analysis/heatmap_grid.h"

#include <qcustomplot.h>

namespace kvscope {

class HeatmapView : public QCustomPlot {
    Q_OBJECT

public:
    explicit HeatmapView(QWidget* parent = nullptr);

    // The labelling of a map: row labels, token text, markers, top labels, title, axis label,
    // and its scale at the spec's range.
    void showMap(const MapSpec& spec);
    // Shows `grid`; columns cover grid.tokensPerColumn tokens each from grid.firstToken.
    void setGrid(const HeatmapGrid& grid);
    // Nothing to show: no map, no scale, `message` in the middle.
    void showEmpty(const QString& message);
    // Covers the rows whose `ready` entry is 0 with `label` ("analysing", "not analysed"); row
    // `startedRow` (not ready) only from token `startedTokens` on, unlabelled: its start is
    // analysed and shown.
    void setPendingRows(const std::vector<char>& ready, const QString& label, int startedRow = -1, qint64 startedTokens = 0);
    void setRowLabels(const QStringList& labels);
    // The suspect's rows: the onset row framed, the spread rows dimmed and labelled `label`
    // (MapSpec::onsetRow, spreadRows). -1 / empty: none.
    void setSuspectRows(int onsetRow, const std::vector<int>& spreadRows, const QString& label);
    bool isSpreadRow(int row) const { return m_spreadRows.contains(row); }
    const QString& spreadLabel() const { return m_spreadLabel; }
    // Rows labelled however many rows share the height (the others thin out around them).
    void setPinnedRows(const QList<int>& rows);
    void setTokenLabels(const QStringList& labels);  // shown on the X axis when zoomed in enough
    void setMarkers(double prefillBoundary, const QVector<double>& divergences);
    void setScale(ScaleKind kind, QCPRange range, bool logarithmic);
    void setTitle(const QString& title);
    const QString& titleText() const { return m_titleText; }  // as set (shown wrapped)
    void setSelection(int row, qint64 token);  // row < 0: none
    // A dashed frame around a region in map coordinates (x0, y0, x1, y1); empty: none.
    void setHighlight(const QVector<double>& corners);
    bool hasHighlight() const;
    void setTopLabels(const QVector<double>& positions, const QStringList& labels);  // e.g. divergence counts
    // The data is `tokens` x `rows`: zoom and pan stay inside it; fits the axes to it.
    void resetView(qint64 tokens, int rows);
    // Back to the whole map.
    void resetZoom();
    // Pans, if needed, so that the cell is visible.
    void ensureVisible(int row, qint64 token);
    bool isEmpty() const { return m_empty; }
    QCPColorScale* colorScale() const { return m_scale; }
    const HeatmapGrid& grid() const { return m_grid; }
    // The cell under a widget position, or false.
    bool cellAt(const QPoint& pos, int& row, qint64& token) const;

signals:
    void cellClicked(int row, qint64 token);
    void cellHovered(int row, qint64 token, const QPoint& globalPos);
    void visibleTokensChanged(double lower, double upper);
    // An arrow key, Enter or Esc while the map has the focus (the page decides what moves).
    void keyPressed(int key);
    void contextMenuRequested(const QPoint& globalPos);

protected:
    void mousePressEvent(QMouseEvent* event) override;
    void mouseMoveEvent(QMouseEvent* event) override;
    void mouseReleaseEvent(QMouseEvent* event) override;
    void mouseDoubleClickEvent(QMouseEvent* event) override;
    void keyPressEvent(QKeyEvent* event) override;
    void contextMenuEvent(QContextMenuEvent* event) override;
    void resizeEvent(QResizeEvent* event) override;
    void paintEvent(QPaintEvent* event) override;
    void focusInEvent(QFocusEvent* event) override;
    void focusOutEvent(QFocusEvent* event) override;

private:
    // What the empty map's message may span: the axis rect's width.
    int emptyTextWidth() const;
    void updateTokenTicks();
    void updateRowTicks();
    void clampRange(QCPAxis* axis, const QCPRange& full);
    void leaveEmpty();
    void emitPendingClick();
    void wrapTitle();

    QCPColorMap* m_map = nullptr;
    QCPColorScale* m_scale = nullptr;
    QCPTextElement* m_title = nullptr;
    QCPItemRect* m_selection = nullptr;
    QCPItemRect* m_highlight = nullptr;
    QCPItemText* m_emptyText = nullptr;
    QList<QCPAbstractItem*> m_markers;
    QList<QCPAbstractItem*> m_pending;
    QList<QCPAbstractItem*> m_suspectMarks;
    QList<int> m_spreadRows;
    QString m_spreadLabel;
    HeatmapGrid m_grid;
    QStringList m_tokenLabels;
    QStringList m_rowLabels;
    QList<int> m_pinnedRows;
    QString m_emptyMessage;
    QString m_titleText;  // as set; shown wrapped to the width
    QTimer* m_clickTimer;  // a click waits out the double-click interval
    int m_clickRow = -1;
    qint64 m_clickToken = 0;
    QCPRange m_fullX{-0.5, 0.5};
    QCPRange m_fullY{-0.5, 0.5};
    QPoint m_pressPos;
    bool m_pressed = false;
    bool m_empty = false;
};

}  // namespace kvscope
