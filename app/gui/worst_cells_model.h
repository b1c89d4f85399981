#pragma once
// The summary panel's list of the worst cells of a prompt (core/worst_cells.h), a click away.

#include "analysis/worst_cells.h"

#include <QAbstractTableModel>

#include <array>
#include <string>

namespace kvscope {

class WorstCellsModel : public QAbstractTableModel {
    Q_OBJECT

public:
    using QAbstractTableModel::QAbstractTableModel;

    void setCells(const PromptAnalysis* prompt, std::vector<WorstCell> cells);
    const WorstCell& cell(int row) const { return m_cells[std::size_t(row)]; }

    int rowCount(const QModelIndex& parent = {}) const override;
    int columnCount(const QModelIndex& parent = {}) const override;
    QVariant data(const QModelIndex& index, int role = Qt::DisplayRole) const override;
    QVariant headerData(int section, Qt::Orientation orientation, int role = Qt::DisplayRole) const override;

private:
    std::vector<WorstCell> m_cells;
    std::vector<std::string> m_layers;
    bool m_threeWay = false;
    std::array<std::string, 2> m_partNames{"k", "v"};  // c_kv, k_pe for an MLA latent
    bool m_oneHead = false;
    std::vector<ProvenanceRange> m_provenance;  // the prompt's: a row's tooltip names its source
};

}  // namespace kvscope
