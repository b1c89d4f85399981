#pragma once
// The drill-down's per-head table for one (prompt, token, layer): per K and V the error ratio
// (analysis_result.h: the head's L-inf over the cell's noise floor), L-inf and L2, actual and
// base, and 1 - cos. One row per head, the head number in the vertical header (so it stays in
// view when the table scrolls). Sortable by the numbers (Qt::UserRole).

#include "analysis/analysis_result.h"

#include <QAbstractTableModel>

#include <memory>

namespace kvscope {

class HeadTableModel : public QAbstractTableModel {
    Q_OBJECT

public:
    using QAbstractTableModel::QAbstractTableModel;

    void setCell(std::shared_ptr<const AnalysisResult> result, int prompt, int layer, qint64 token);
    void clear();
    void setHighlightedHeads(const std::vector<int>& heads);
    bool isHighlighted(int head) const;

    int rowCount(const QModelIndex& parent = {}) const override;
    int columnCount(const QModelIndex& parent = {}) const override;
    QVariant data(const QModelIndex& index, int role = Qt::DisplayRole) const override;
    QVariant headerData(int section, Qt::Orientation orientation, int role = Qt::DisplayRole) const override;

    // The number shown in (head, column): NaN where there is no data.
    double value(int head, int column) const;
    // The columns of K or V.
    static QList<int> columnsOf(KvPart part);
    static int ratioColumn(KvPart part);
    // The cell's noise floor (max base L-inf over heads), NaN when two-way.
    double noiseFloor(KvPart part) const;

private:
    std::shared_ptr<const AnalysisResult> m_result;
    int m_prompt = -1;
    int m_layer = 0;
    qint64 m_token = 0;
    std::vector<int> m_highlighted;
};

}  // namespace kvscope
