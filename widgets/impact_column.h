#pragma once
// Whether each layer's KV error matters (analysis/impact_view_text.h), as a narrow column beside
// a layer map: a bar per map row, the KL of the reference's next token with the engine's KV in
// that layer alone (the largest over the decode steps, on a log scale), a tick at the baseline's
// KL there (bf16 noise), the bar in the map's ratio colours when beyond the noise and grey within
// it. It follows the map's layer axis (zoom and pan); a hover gives the layer's four rows. Hidden
// when no layer has a record.

#include "analysis/impact_view_text.h"

#include <QColor>
#include <QWidget>

#include <vector>

namespace kvscope {

class HeatmapView;

class ImpactColumn : public QWidget {
    Q_OBJECT

public:
    // `map`: the layer map beside it, whose rows it follows; they must share their top.
    explicit ImpactColumn(HeatmapView* map, QWidget* parent = nullptr);

    // Row r of the map is layers[r] (layerImpacts over the shown prompt); none with a record: hidden.
    void setImpacts(std::vector<LayerImpact> layers);
    bool hasImpact() const { return m_lower > 0; }
    // The map's row at y (in this widget), or -1.
    int rowAt(int y) const;
    // What a hover at y says: the layer and its rows (empty: no row there, or none measured).
    QString describeAt(int y) const;
    // The bar of `row` in this widget (empty: none drawn), and its colour.
    QRectF barRect(int row) const;
    static QColor barColour(const LayerImpact& layer);
    // The KL range the bars span (log scale): half the smallest of the layers' and their noise's
    // largest KL, up to the largest (at least a decade).
    double lowerKl() const { return m_lower; }
    double upperKl() const { return m_upper; }

    QSize sizeHint() const override;
    QSize minimumSizeHint() const override { return sizeHint(); }

protected:
    void paintEvent(QPaintEvent* event) override;
    void mouseMoveEvent(QMouseEvent* event) override;

private:
    // The map's y (its widget) in this widget, and back.
    double fromMap(double y) const;
    double toMap(double y) const;
    // x of `kl` on the column's log scale.
    double klX(double kl) const;
    QRect axisBand() const;  // the map's axis rect's rows, in this widget

    HeatmapView* m_map;
    std::vector<LayerImpact> m_layers;
    double m_lower = 0, m_upper = 0;
};

}  // namespace kvscope
