#include "gui/head_table_model.h"

#include <QColor>
#include <QRegularExpression>

#include <algorithm>
#include <cmath>

namespace kvscope {

namespace {

// Per part: the error ratio, the engine's L-inf, the expected's (base) L-inf, then L2, and 1 - cos.
// The base L2 is in the L2 cell's tooltip: a sixth column would not fit beside the histogram
// and the line plot on a 1024-pixel screen, and the ratio is of the L-infs.
enum class Shown { Actual, Base, Ratio };
struct Column {
    const char* title;
    const char* tip;
    KvPart part;
    MetricKind kind;
    Shown shown;
};
constexpr MetricKind kLinf = MetricKind::Linf, kL2 = MetricKind::L2, kCos = MetricKind::Cos;
const Column kColumns[] = {
    {"ratio", "K relative L-inf / the cell's K noise floor (max base L-inf over heads)", KvPart::K, kLinf, Shown::Ratio},
    {"L-inf", "K relative L-inf, engine vs reference", KvPart::K, kLinf, Shown::Actual},
    {"base L-inf", "K relative L-inf, expected vs baseline (dtype noise)", KvPart::K, kLinf, Shown::Base},
    {"L2", "K relative L2, engine vs reference (the tooltip: expected vs baseline's)", KvPart::K, kL2, Shown::Actual},
    {"1 - cos", "K 1 - cosine similarity, engine vs reference", KvPart::K, kCos, Shown::Actual},
    {"ratio", "V relative L-inf / the cell's V noise floor (max base L-inf over heads)", KvPart::V, kLinf, Shown::Ratio},
    {"L-inf", "V relative L-inf, engine vs reference", KvPart::V, kLinf, Shown::Actual},
    {"base L-inf", "V relative L-inf, expected vs baseline (dtype noise)", KvPart::V, kLinf, Shown::Base},
    {"L2", "V relative L2, engine vs reference (the tooltip: expected vs baseline's)", KvPart::V, kL2, Shown::Actual},
    {"1 - cos", "V 1 - cosine similarity, engine vs reference", KvPart::V, kCos, Shown::Actual},
};
constexpr int kColumnCount = int(std::size(kColumns));

}  // namespace

void HeadTableModel::setCell(std::shared_ptr<const AnalysisResult> result, int prompt, int layer, qint64 token)
{
    beginResetModel();
    m_result = std::move(result);
    m_prompt = prompt;
    m_layer = layer;
    m_token = token;  // (the marked heads stay: they are the suspect's, whichever cell is shown)
    endResetModel();
}

void HeadTableModel::clear()
{
    beginResetModel();
    m_result.reset();
    m_prompt = -1;
    m_highlighted.clear();
    endResetModel();
}

void HeadTableModel::setHighlightedHeads(const std::vector<int>& heads)
{
    m_highlighted = heads;
    if (rowCount() > 0) {
        emit dataChanged(index(0, 0), index(rowCount() - 1, columnCount() - 1), {Qt::BackgroundRole});
        emit headerDataChanged(Qt::Vertical, 0, rowCount() - 1);
    }
}

bool HeadTableModel::isHighlighted(int head) const
{
    return std::find(m_highlighted.begin(), m_highlighted.end(), head) != m_highlighted.end();
}

QList<int> HeadTableModel::columnsOf(KvPart part)
{
    QList<int> columns;
    for (int c = 0; c < kColumnCount; ++c)
        if (kColumns[c].part == part)
            columns << c;
    return columns;
}

int HeadTableModel::ratioColumn(KvPart part)
{
    for (int c = 0; c < kColumnCount; ++c)
        if (kColumns[c].part == part && kColumns[c].shown == Shown::Ratio)
            return c;
    return -1;
}

double HeadTableModel::noiseFloor(KvPart part) const
{
    if (!m_result || m_prompt < 0 || !m_result->prompts[std::size_t(m_prompt)].threeWay)
        return std::nan("");
    return kvscope::noiseFloor(m_result->prompts[std::size_t(m_prompt)], metricFor(part, MetricKind::Linf), m_layer, m_token);
}

int HeadTableModel::rowCount(const QModelIndex& parent) const
{
    if (parent.isValid() || !m_result || m_prompt < 0)
        return 0;
    const PromptAnalysis& p = m_result->prompts[std::size_t(m_prompt)];
    return m_layer >= 0 ? p.headsOf(m_layer) : p.heads;  // the layer's own heads (groups may differ)
}

int HeadTableModel::columnCount(const QModelIndex& parent) const
{
    return parent.isValid() ? 0 : kColumnCount;
}

double HeadTableModel::value(int head, int column) const
{
    if (!m_result || m_prompt < 0 || column < 0 || column >= kColumnCount)
        return std::nan("");
    const PromptAnalysis& p = m_result->prompts[std::size_t(m_prompt)];
    const Column& c = kColumns[column];
    const Metric m = metricFor(c.part, c.kind);
    if (c.shown == Shown::Ratio)
        return p.threeWay ? headErrorRatio(p, m, m_layer, m_token, head) : std::nan("");
    if (c.shown == Shown::Base && !p.threeWay)
        return std::nan("");
    const double v = p.value(c.shown == Shown::Base ? baseOf(m) : m, m_layer, m_token, head);
    return c.kind == kCos ? 1.0 - v : v;  // as the heatmap shows it: cos reads 1 to four digits
}

QVariant HeadTableModel::data(const QModelIndex& index, int role) const
{
    if (!index.isValid() || index.row() >= rowCount() || index.column() >= kColumnCount)
        return {};
    const double v = value(index.row(), index.column());
    switch (role) {
    case Qt::DisplayRole:
        return std::isnan(v) ? QStringLiteral("-") : QString::number(v, 'g', 4);
    case Qt::UserRole:  // sorting: no data sorts last
        return std::isnan(v) ? QVariant(-1e300) : QVariant(v);
    case Qt::TextAlignmentRole:
        return int(Qt::AlignRight | Qt::AlignVCenter);
    case Qt::ForegroundRole:
        return std::isnan(v) ? QVariant(QColor(Qt::gray)) : QVariant();
    case Qt::ToolTipRole:  // the L2's noise level, which has no column of its own
        if (const Column& c = kColumns[index.column()]; c.kind == kL2 && c.shown == Shown::Actual) {
            const PromptAnalysis& p = m_result->prompts[std::size_t(m_prompt)];
            if (!p.threeWay)
                return {};
            const float base = p.value(baseOf(metricFor(c.part, kL2)), m_layer, m_token, index.row());
            return QStringLiteral("L2 %1; expected vs baseline (dtype noise): %2").arg(v, 0, 'g', 4).arg(base, 0, 'g', 4);
        }
        return {};
    case Qt::BackgroundRole:  // a suspect's heads
        return isHighlighted(index.row()) ? QVariant(QColor(255, 240, 170)) : QVariant();
    default:
        return {};
    }
}

QVariant HeadTableModel::headerData(int section, Qt::Orientation orientation, int role) const
{
    const PromptAnalysis* p = m_result && m_prompt >= 0 ? &m_result->prompts[std::size_t(m_prompt)] : nullptr;
    if (orientation == Qt::Vertical && role == Qt::DisplayRole && section >= 0 && section < rowCount()) {
        const QString name = p && p->heads == 1 && p->partNames[0] != "k" ? tr("latent") : QStringLiteral("head %1").arg(section);
        return isHighlighted(section) ? name + " *" : name;
    }
    if (orientation != Qt::Horizontal || section < 0 || section >= kColumnCount)
        return QAbstractTableModel::headerData(section, orientation, role);
    if (role == Qt::DisplayRole)
        return QString::fromLatin1(kColumns[section].title);
    if (role == Qt::ToolTipRole) {
        // The tips name K or V first; an MLA latent's parts are c_kv and k_pe.
        QString tip = QString::fromLatin1(kColumns[section].tip);
        if (p)
            tip.replace(QRegularExpression("\\b" + QString(kColumns[section].part == KvPart::K ? "K" : "V") + "\\b"),
                        QString::fromStdString(partTitle(*p, kColumns[section].part)));
        return tip;
    }
    return {};
}

}  // namespace kvscope
