#pragma once
// The drill-down's per-head table for one (prompt, token, layer): every metric for K and V,
// actual and base, and the error ratio. Sortable by the numbers (Qt::UserRole).

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

    int rowCount(const QModelIndex& parent = {}) const override;
    int columnCount(const QModelIndex& parent = {}) const override;
    QVariant data(const QModelIndex& index, int role = Qt::DisplayRole) const override;
    QVariant headerData(int section, Qt::Orientation orientation, int role = Qt::DisplayRole) const override;

    // The number shown in (head, column): NaN where there is no data.
    double value(int head, int column) const;

private:
    std::shared_ptr<const AnalysisResult> m_result;
    int m_prompt = -1;
    int m_layer = 0;
    qint64 m_token = 0;
};

}  // namespace kvscope
