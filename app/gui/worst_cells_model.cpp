#include "gui/worst_cells_model.h"

#include "format/kv_cache_config.h"

namespace kvscope {

void WorstCellsModel::setCells(const PromptAnalysis* prompt, std::vector<WorstCell> cells)
{
    beginResetModel();
    m_cells = prompt ? std::move(cells) : std::vector<WorstCell>{};
    m_layers = prompt ? prompt->layers : std::vector<std::string>{};
    m_threeWay = prompt && prompt->threeWay;
    m_partNames = prompt ? prompt->partNames : std::array<std::string, 2>{"k", "v"};
    m_oneHead = prompt && prompt->heads == 1;
    endResetModel();
}

int WorstCellsModel::rowCount(const QModelIndex& parent) const
{
    return parent.isValid() ? 0 : int(m_cells.size());
}

int WorstCellsModel::columnCount(const QModelIndex& parent) const
{
    return parent.isValid() ? 0 : 6;
}

QVariant WorstCellsModel::data(const QModelIndex& index, int role) const
{
    if (!index.isValid() || index.row() >= rowCount() || index.column() >= 6)
        return {};
    const WorstCell& c = m_cells[std::size_t(index.row())];
    if (role == Qt::ToolTipRole)
        return QString::fromStdString(m_layers[std::size_t(c.layer)]);
    if (role == Qt::TextAlignmentRole)
        return int(Qt::AlignRight | Qt::AlignVCenter);
    if (role != Qt::DisplayRole)
        return {};
    // The ranking key first: ratio (three-way) or L-inf (two-way).
    switch (index.column()) {
    case 0: {  // the number in the layer's name (as the map's rows say it); the name is the tooltip
        const long long number = layerNumber(m_layers[std::size_t(c.layer)]);
        return number >= 0 ? number : qlonglong(c.layer);
    }
    case 1:
        return qlonglong(c.token);
    case 2:
        if (m_oneHead)  // an MLA latent: one vector, no head to name
            return QString::fromStdString(m_partNames[std::size_t(c.part)]);
        return QString("%1 %2").arg(QString::fromStdString(m_partNames[std::size_t(c.part)])).arg(c.head);
    case 3:
        return m_threeWay ? QString::number(c.ratio, 'g', 4) : QString::number(c.error, 'g', 4);
    case 4:
        return m_threeWay ? QString::number(c.error, 'g', 4) : QStringLiteral("-");
    case 5:
        return m_threeWay ? QString::number(c.baseError, 'g', 4) : QStringLiteral("-");
    }
    return {};
}

QVariant WorstCellsModel::headerData(int section, Qt::Orientation orientation, int role) const
{
    if (orientation != Qt::Horizontal || section < 0 || section >= 6)
        return QAbstractTableModel::headerData(section, orientation, role);
    static const char* const titles[] = {"layer", "token", "head", "ratio", "L-inf", "floor"};
    static const char* const tips[] = {
        "the layer (the number in its name, as the map's rows give it)", "the token", "K or V, and the worst head of the cell",
        "three-way: the cell's error ratio = L-inf / floor (the ranking key); two-way: the relative L-inf",
        "the head's relative L-inf, engine vs reference",
        "the cell's noise floor: its largest expected-vs-baseline L-inf over heads"};
    if (role == Qt::DisplayRole) {
        if (section == 2 && m_oneHead)
            return QStringLiteral("part");  // an MLA latent: c_kv or k_pe, no heads
        return section == 3 && !m_threeWay ? QStringLiteral("L-inf") : QString::fromLatin1(titles[section]);
    }
    if (role == Qt::ToolTipRole)
        return section == 2 && m_oneHead ? QStringLiteral("c_kv or k_pe of the latent") : QString::fromLatin1(tips[section]);
    return {};
}

}  // namespace kvscope
