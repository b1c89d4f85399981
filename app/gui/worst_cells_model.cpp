#include "gui/worst_cells_model.h"

#include "analysis/source_summary.h"
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
    m_provenance = prompt ? prompt->provenance : std::vector<ProvenanceRange>{};
    endResetModel();
}

int WorstCellsModel::rowCount(const QModelIndex& parent) const
{
    return parent.isValid() ? 0 : int(m_cells.size());
}

int WorstCellsModel::columnCount(const QModelIndex& parent) const
{
    return parent.isValid() ? 0 : 5;
}

QVariant WorstCellsModel::data(const QModelIndex& index, int role) const
{
    if (!index.isValid() || index.row() >= rowCount() || index.column() >= 5)
        return {};
    const WorstCell& c = m_cells[std::size_t(index.row())];
    if (role == Qt::ToolTipRole) {  // the floor here: a sixth column would not fit a 1024-pixel screen's side panel
        const QString layer = QString::fromStdString(m_layers[std::size_t(c.layer)]);
        const ProvenanceRange* source = provenanceAt(m_provenance, c.token);
        const QString from = source ? QStringLiteral("; KV from %1").arg(QString::fromStdString(sourceOf(*source))) : QString();
        if (c.nonFinite)
            return layer + QStringLiteral(": an input holds NaN or infinity, listed first whatever the floor") + from;
        return QStringLiteral("%1, token %2: %3 %4 over the cell's noise floor %5 = %6 floors%7")
            .arg(layer)
            .arg(c.token)
            .arg(m_threeWay ? QStringLiteral("L-inf") : QStringLiteral("L2"))
            .arg(c.error, 0, 'g', 4)
            .arg(c.baseError, 0, 'g', 4)
            .arg(c.ratio, 0, 'g', 4)
            .arg(from);
    }
    if (role == Qt::TextAlignmentRole)
        return int(Qt::AlignRight | Qt::AlignVCenter);
    if (role != Qt::DisplayRole)
        return {};
    // The ranking key first: the error in floors, as the map colours it.
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
    case 3:  // a NaN or infinity has no number of floors: it says what it is
        return c.nonFinite ? QString::fromStdString(nonFiniteText(c)) : QString::number(c.ratio, 'g', 4);
    case 4:
        return c.nonFinite ? QString::fromStdString(nonFiniteSideText(c)) : QString::number(c.error, 'g', 4);
    }
    return {};
}

QVariant WorstCellsModel::headerData(int section, Qt::Orientation orientation, int role) const
{
    if (orientation != Qt::Horizontal || section < 0 || section >= 5)
        return QAbstractTableModel::headerData(section, orientation, role);
    const QString statistic = m_threeWay ? QStringLiteral("L-inf") : QStringLiteral("L2");
    if (role == Qt::DisplayRole) {
        switch (section) {
        case 2:
            return m_oneHead ? QStringLiteral("part") : QStringLiteral("head");  // an MLA latent: c_kv or k_pe, no heads
        case 3:
            return QStringLiteral("floors");
        case 4:
            return statistic;
        default:
            return section == 0 ? QStringLiteral("layer") : QStringLiteral("token");
        }
    }
    if (role == Qt::ToolTipRole) {
        switch (section) {
        case 0:
            return QStringLiteral("the layer (the number in its name, as the map's rows give it)");
        case 1:
            return QStringLiteral("the token");
        case 2:
            return m_oneHead ? QStringLiteral("c_kv or k_pe of the latent") : QStringLiteral("K or V, and the worst head of the cell");
        case 3:
            return QStringLiteral("the error in noise floors (%1 / floor), the number the map colours; the ranking key").arg(statistic);
        default:
            return QStringLiteral("the head's relative %1, engine vs reference; a row's tooltip gives the cell's noise floor (%2)")
                .arg(statistic)
                .arg(m_threeWay ? QStringLiteral("its largest expected-vs-baseline L-inf over heads")
                                : QStringLiteral("the cache dtype's rounding, bf16 2^-8, or what storing the reference in "
                                                 "the cache's quantised format costs"));
        }
    }
    return {};
}

}  // namespace kvscope
