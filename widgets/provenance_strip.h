#pragma once
// Where each position's KV came from (format/provenance.h), as a strip under a map's token
// axis: a band coloured by source (prefill, prefix cache, a connector, decode, ...) with a
// line where the source changes (so prefill chunks show their boundaries), a legend of the
// sources present under it, and a hover that names a position's source. It follows the map's
// zoom and pan; it hides itself when the prompt recorded no provenance.

#include "format/provenance.h"

#include <QColor>
#include <QWidget>

#include <vector>

namespace kvscope {

class HeatmapView;

class ProvenanceStrip : public QWidget {
    Q_OBJECT

public:
    // `map`: the map above, whose token axis this strip shares; they must start at the same x.
    explicit ProvenanceStrip(HeatmapView* map, QWidget* parent = nullptr);

    void setProvenance(std::vector<ProvenanceRange> ranges);
    bool hasProvenance() const { return !m_ranges.empty(); }
    // What the hover says of `position`: "position 70: 64-127 external (NixlConnector)".
    QString describeAt(qint64 position) const;
    // The position under x (in this widget), or -1 off the map's axis.
    qint64 positionAt(int x) const;
    static QColor kindColour(ProvenanceKind kind);

    QSize sizeHint() const override;
    QSize minimumSizeHint() const override { return sizeHint(); }

protected:
    void paintEvent(QPaintEvent* event) override;
    void mouseMoveEvent(QMouseEvent* event) override;

private:
    int bandHeight() const;

    HeatmapView* m_map;
    std::vector<ProvenanceRange> m_ranges;
};

}  // namespace kvscope
