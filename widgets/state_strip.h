#pragma once
// A hybrid model's state-space layers under a map (analysis/state_rows.h): a row per layer in
// the model's order, a cell per checkpoint where the state's last absorbed position lies on the
// map's token axis, coloured by the map's ratio scale (in units of the layer's off threshold),
// with the row's label in the map's label margin. It follows the map's zoom and pan; a hover
// says the checkpoint's worst cells per part (SSM heads, conv channels). Hidden without states.

#include "analysis/state_rows.h"

#include <QWidget>

#include <vector>

namespace kvscope {

class HeatmapView;

class StateStrip : public QWidget {
    Q_OBJECT

public:
    explicit StateStrip(HeatmapView* map, QWidget* parent = nullptr);

    // The prompt's states (nothing: hidden).
    void setStates(std::vector<StateRow> rows, std::vector<StateLayerAnalysis> states);
    int rowCount() const { return int(m_rows.size()); }
    // What a hover at (x, y) says (empty: no cell there).
    QString describeAt(const QPoint& at) const;

    QSize sizeHint() const override;
    QSize minimumSizeHint() const override { return sizeHint(); }

signals:
    // A checkpoint clicked: its words, for the page to show where it shows a cell's, and its
    // worst cell (a part's cell, analysis/state_analysis.h), whose histogram the page shows.
    void checkpointClicked(const QString& text, const QString& layer, qint64 position, const QString& part, qint64 cell);

protected:
    void paintEvent(QPaintEvent* event) override;
    void mouseMoveEvent(QMouseEvent* event) override;
    void mousePressEvent(QMouseEvent* event) override;

private:
    int rowHeight() const;
    int titleHeight() const;
    // The row and checkpoint under `at` (-1 / nullptr when none).
    int rowAt(int y) const;
    const StateRowCell* cellAt(const QPoint& at, int* row) const;

    HeatmapView* m_map;
    std::vector<StateRow> m_rows;
    std::vector<StateLayerAnalysis> m_states;
};

}  // namespace kvscope
