#include "gui/head_table_model.h"

#include <QColor>

#include <cmath>

namespace kvscope {

namespace {

// Columns after "head": per part, the engine's L-inf, the expected's (base) L-inf, their
// ratio, then L2 and cos likewise.
enum class Shown { Actual, Base, Ratio };
struct Column {
    const char* title;
    KvPart part;
    MetricKind kind;
    Shown shown;
};
constexpr MetricKind kLinf = MetricKind::Linf, kL2 = MetricKind::L2, kCos = MetricKind::Cos;
const Column kColumns[] = {
    {"k L-inf", KvPart::K, kLinf, Shown::Actual}, {"base k L-inf", KvPart::K, kLinf, Shown::Base},
    {"k ratio", KvPart::K, kLinf, Shown::Ratio},  {"k L2", KvPart::K, kL2, Shown::Actual},
    {"base k L2", KvPart::K, kL2, Shown::Base},   {"k cos", KvPart::K, kCos, Shown::Actual},
    {"v L-inf", KvPart::V, kLinf, Shown::Actual}, {"base v L-inf", KvPart::V, kLinf, Shown::Base},
    {"v ratio", KvPart::V, kLinf, Shown::Ratio},  {"v L2", KvPart::V, kL2, Shown::Actual},
    {"base v L2", KvPart::V, kL2, Shown::Base},   {"v cos", KvPart::V, kCos, Shown::Actual},
};
constexpr int kColumnCount = int(std::size(kColumns)) + 1;

}  // namespace

void HeadTableModel::setCell(std::shared_ptr<const AnalysisResult> result, int prompt, int layer, qint64 token)
{
    beginResetModel();
    m_result = std::move(result);
    m_prompt = prompt;
    m_layer = layer;
    m_token = token;
    endResetModel();
}

void HeadTableModel::clear()
{
    beginResetModel();
    m_result.reset();
    m_prompt = -1;
    endResetModel();
}

int HeadTableModel::rowCount(const QModelIndex& parent) const
{
    if (parent.isValid() || !m_result || m_prompt < 0)
        return 0;
    return m_result->prompts[std::size_t(m_prompt)].heads;
}

int HeadTableModel::columnCount(const QModelIndex& parent) const
{
    return parent.isValid() ? 0 : kColumnCount;
}

double HeadTableModel::value(int head, int column) const
{
    if (!m_result || m_prompt < 0 || column < 1 || column >= kColumnCount)
        return std::nan("");
    const PromptAnalysis& p = m_result->prompts[std::size_t(m_prompt)];
    const Column& c = kColumns[column - 1];
    const Metric m = metricFor(c.part, c.kind);
    if (c.shown == Shown::Ratio) {
        const float t = p.value(m, m_layer, m_token, head), b = p.value(baseOf(m), m_layer, m_token, head);
        return std::isnan(t) || std::isnan(b) ? std::nan("") : double(t) / std::max(double(b), 1e-10);
    }
    return p.value(c.shown == Shown::Base ? baseOf(m) : m, m_layer, m_token, head);
}

QVariant HeadTableModel::data(const QModelIndex& index, int role) const
{
    if (!index.isValid() || index.row() >= rowCount() || index.column() >= kColumnCount)
        return {};
    if (index.column() == 0)
        return role == Qt::DisplayRole || role == Qt::UserRole ? QVariant(index.row()) : QVariant();
    const double v = value(index.row(), index.column());
    switch (role) {
    case Qt::DisplayRole:
        return std::isnan(v) ? QStringLiteral("no data") : QString::number(v, 'g', 5);
    case Qt::UserRole:  // sorting: no data sorts last
        return std::isnan(v) ? QVariant(-1e300) : QVariant(v);
    case Qt::TextAlignmentRole:
        return int(Qt::AlignRight | Qt::AlignVCenter);
    case Qt::ForegroundRole:
        return std::isnan(v) ? QVariant(QColor(Qt::gray)) : QVariant();
    default:
        return {};
    }
}

QVariant HeadTableModel::headerData(int section, Qt::Orientation orientation, int role) const
{
    if (orientation != Qt::Horizontal || role != Qt::DisplayRole || section < 0 || section >= kColumnCount)
        return QAbstractTableModel::headerData(section, orientation, role);
    return section == 0 ? QStringLiteral("head") : QString::fromLatin1(kColumns[section - 1].title);
}

}  // namespace kvscope
