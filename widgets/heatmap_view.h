#pragma once
// A layer x token heatmap (QCustomPlot colour map with a colour scale): layer names on the Y
// axis, tokens on X, the prefill/decode boundary (red) and divergences (orange, dashed),
// absent cells hatched grey, the selected cell outlined. Emits the cell under the mouse.

#include "widgets/color_scales.h"
#include "analysis/heatmap_grid.h"

#include <qcustomplot.h>

namespace kvscope {

class HeatmapView : public QCustomPlot {
    Q_OBJECT

public:
    explicit HeatmapView(QWidget* parent = nullptr);

    // The labelling of a map: row labels, token text, markers, top labels, title, axis label,
    // and its scale at its default range.
    void showMap(const MapSpec& spec);
    // Shows `grid`; columns cover grid.tokensPerColumn tokens each from grid.firstToken.
    void setGrid(const HeatmapGrid& grid);
    void setRowLabels(const QStringList& labels);
    void setTokenLabels(const QStringList& labels);  // shown on the X axis when zoomed in enough
    void setMarkers(double prefillBoundary, const QVector<double>& divergences);
    void setScale(ScaleKind kind, QCPRange range, bool logarithmic);
    void setTitle(const QString& title);
    void setSelection(int row, qint64 token);  // row < 0: none
    void setTopLabels(const QVector<double>& positions, const QStringList& labels);  // e.g. divergence counts
    // Fits the axes to `tokens` x `rows`.
    void resetView(qint64 tokens, int rows);
    QCPColorScale* colorScale() const { return m_scale; }
    const HeatmapGrid& grid() const { return m_grid; }
    // The cell under a widget position, or false.
    bool cellAt(const QPoint& pos, int& row, qint64& token) const;

signals:
    void cellClicked(int row, qint64 token);
    void cellHovered(int row, qint64 token, const QPoint& globalPos);
    void visibleTokensChanged(double lower, double upper);

protected:
    void mousePressEvent(QMouseEvent* event) override;
    void mouseMoveEvent(QMouseEvent* event) override;
    void resizeEvent(QResizeEvent* event) override;

private:
    void updateTokenTicks();
    void updateRowTicks();

    QCPColorMap* m_map = nullptr;
    QCPColorScale* m_scale = nullptr;
    QCPTextElement* m_title = nullptr;
    QCPItemRect* m_selection = nullptr;
    QList<QCPAbstractItem*> m_markers;
    HeatmapGrid m_grid;
    QStringList m_tokenLabels;
    QStringList m_rowLabels;
    QPoint m_pressPos;
};

}  // namespace kvscope
