#include "gui/transfer_view.h"

#include "gui/map_box.h"
#include "transfer/transfer_map.h"
#include "widgets/heatmap_view.h"

#include <QComboBox>
#include <QHeaderView>
#include <QLabel>
#include <QSplitter>
#include <QTableWidget>
#include <QToolTip>
#include <QVBoxLayout>

namespace kvscope {

namespace {

QString rangesText(const std::vector<PositionRange>& ranges)
{
    QStringList parts;
    for (const PositionRange& r : ranges)
        parts << (r.end - r.begin == 1 ? QString::number(r.begin) : QString("%1-%2").arg(r.begin).arg(r.end - 1));
    return parts.isEmpty() ? QObject::tr("none") : parts.join(", ");
}

QString positionsText(const std::vector<std::int64_t>& positions)
{
    if (positions.empty())
        return QObject::tr("none");
    const auto [lo, hi] = std::minmax_element(positions.begin(), positions.end());
    return *lo == *hi ? QString::number(*lo) : QString("%1-%2").arg(*lo).arg(*hi);
}

}  // namespace

QString transferSummary(const TransferResult& r)
{
    QString text = QObject::tr("Producer: %1. %2 prompt(s) matched by their tokens, %3 transferred position(s) compared bit for bit")
                       .arg(QString::fromStdString(r.producerPath).toHtmlEscaped())
                       .arg(r.prompts.size())
                       .arg(r.comparedPositions);
    if (!r.onlyProducer.empty() || !r.onlyConsumer.empty())
        text += QObject::tr("; not matched: %1 of the producer's, %2 of the consumer's").arg(r.onlyProducer.size()).arg(r.onlyConsumer.size());
    text += ".<br>";
    if (r.comparedPositions == 0)
        return text + QObject::tr("<b style='color:#b2182b'>Nothing was transferred</b> (no position both hold was loaded)");
    if (r.changedBlocks == 0)
        return text + QObject::tr("<b>Identical</b>: every transferred position's K and V are the producer's");
    QStringList explanations;
    for (const auto& [name, count] : r.byExplanation)
        explanations << QString("%1 %2").arg(count).arg(QString::fromStdString(name));
    text += QObject::tr("<b style='color:#b2182b'>%1 block(s) changed</b> (%2)").arg(r.changedBlocks).arg(explanations.join(", "));
    if (const std::optional<FirstChange>& f = r.firstChange)
        text += QObject::tr("; first at %1, position %2 of %3, head %4 %5 (block %6: the producer's physical %7, the consumer's %8)")
                    .arg(QString::fromStdString(r.layers[f->layer].name))
                    .arg(f->at.position)
                    .arg(QString::fromStdString(r.prompts[f->prompt].consumer))
                    .arg(f->at.head)
                    .arg(f->at.part == KvPart::K ? "K" : "V")
                    .arg(f->block)
                    .arg(f->producerBlock)
                    .arg(f->consumerBlock);
    if (r.changed.size() < r.changedBlocks)
        text += QObject::tr(" (the first %1 listed)").arg(r.changed.size());
    return text + QObject::tr(". On the map, positions not compared (missing, extra, or computed by the consumer) are hatched.");
}

TransferView::TransferView(QWidget* parent)
    : QWidget(parent)
    , m_summary(new QLabel)
    , m_prompt(new QComboBox)
    , m_map(new HeatmapView)
    , m_table(new QTableWidget)
    , m_cell(new QLabel)
{
    setObjectName("transferView");
    m_table->setObjectName("transferTable");
    m_summary->setWordWrap(true);
    m_summary->setTextInteractionFlags(Qt::TextSelectableByMouse);
    m_cell->setWordWrap(true);
    m_cell->setTextInteractionFlags(Qt::TextSelectableByMouse);
    m_cell->setAlignment(Qt::AlignTop | Qt::AlignLeft);
    m_table->setEditTriggers(QAbstractItemView::NoEditTriggers);
    m_table->setSelectionBehavior(QAbstractItemView::SelectRows);
    m_table->setSelectionMode(QAbstractItemView::SingleSelection);
    m_table->verticalHeader()->hide();
    m_table->setWordWrap(false);
    auto* lower = new QSplitter(Qt::Horizontal);
    lower->addWidget(m_table);
    lower->addWidget(m_cell);
    lower->setStretchFactor(0, 1);
    lower->setStretchFactor(1, 1);
    lower->setSizes({500, 500});  // (the table's size hint would take nearly all: the block's words need room)
    auto* split = new QSplitter(Qt::Vertical);
    split->addWidget(mapBox({{m_prompt, 1}}, m_map));
    split->addWidget(lower);
    split->setStretchFactor(0, 3);
    split->setStretchFactor(1, 2);
    auto* layout = new QVBoxLayout(this);
    layout->setContentsMargins(0, 0, 0, 0);
    layout->addWidget(m_summary);
    layout->addWidget(split, 1);

    connect(m_prompt, &QComboBox::currentIndexChanged, this, &TransferView::showMap);
    connect(m_map, &HeatmapView::cellClicked, this, &TransferView::showCell);
    connect(m_map, &HeatmapView::cellHovered, this, [this](int row, qint64 position, const QPoint& at) {
        const QString text = cellText(row, position);
        if (text.isEmpty())
            QToolTip::hideText();
        else
            QToolTip::showText(at, text, m_map);
    });
    // A changed block of the table: its prompt on the map, its first changed position selected.
    connect(m_table, &QTableWidget::cellClicked, this, [this](int row, int) {
        if (!m_result || row < 0 || std::size_t(row) >= m_result->changed.size())
            return;
        const ChangedBlock& b = m_result->changed[std::size_t(row)].block;
        m_prompt->setCurrentIndex(int(b.prompt));
        const qint64 position = b.changedPositions.empty() ? 0 : b.changedPositions.front();
        m_map->ensureVisible(int(b.layer), position);
        showCell(int(b.layer), position);
    });
}

void TransferView::clear(const QString& message)
{
    m_result.reset();
    const QSignalBlocker block(m_prompt);
    m_prompt->clear();
    m_table->clear();
    m_table->setRowCount(0);
    m_table->setColumnCount(0);
    m_cell->clear();
    m_summary->setText(message);
    m_map->showEmpty(tr("Compare with the producer's capture to see what arrived"));
}

void TransferView::show(std::shared_ptr<const TransferResult> result)
{
    m_result = std::move(result);
    m_summary->setText(transferSummary(*m_result));
    {
        const QSignalBlocker block(m_prompt);
        m_prompt->clear();
        for (const PromptTransfer& p : m_result->prompts)
            m_prompt->addItem(QString::fromStdString(p.consumer == p.producer ? p.consumer : p.consumer + " = the producer's " + p.producer),
                              tr("%1 changed block(s); transferred %2; missing %3; extra %4")
                                  .arg(p.changedBlocks)
                                  .arg(rangesText(p.positions.transferred), rangesText(p.positions.missing),
                                       rangesText(p.positions.extra)));
        for (int i = 0; i < m_prompt->count(); ++i)
            m_prompt->setItemData(i, m_prompt->itemData(i), Qt::ToolTipRole);
    }
    fillTable();
    showMap();
    if (!m_result->changed.empty())
        emit m_table->cellClicked(0, 0);  // the first change
    else
        m_cell->setText(tr("Per prompt, transferred / missing / extra positions are in the prompt list's tooltips."));
}

void TransferView::fillTable()
{
    const TransferResult& r = *m_result;
    m_table->clear();
    m_table->setColumnCount(5);
    m_table->setHorizontalHeaderLabels({tr("layer"), tr("prompt"), tr("positions"), tr("heads"), tr("explanation")});
    m_table->setRowCount(int(r.changed.size()));
    for (int row = 0; row < int(r.changed.size()); ++row) {
        const BlockFinding& f = r.changed[std::size_t(row)];
        const QString layer = QString::fromStdString(r.layers[f.block.layer].name);
        QStringList heads;
        for (int h : f.block.heads)
            heads << QString::number(h);
        const QString sentence = QString::fromStdString(f.explanation.sentence);
        const QStringList cells{QString::fromStdString(shortLayerName(r.layers[f.block.layer].name)),
                                QString::fromStdString(r.prompts[f.block.prompt].consumer), positionsText(f.block.changedPositions),
                                heads.size() > 4 ? tr("%1 heads").arg(heads.size()) : heads.join(","),
                                QString::fromStdString(f.explanation.name)};
        for (int c = 0; c < cells.size(); ++c) {
            auto* item = new QTableWidgetItem(cells[c]);
            item->setToolTip(c == 0 ? layer : sentence);
            if (!f.explanation.explained())
                item->setForeground(QColor(178, 24, 43));
            m_table->setItem(row, c, item);
        }
    }
    m_table->resizeColumnsToContents();
}

void TransferView::showMap()
{
    if (!m_result || m_prompt->currentIndex() < 0)
        return;
    const TransferMap map = transferMap(*m_result, std::size_t(m_prompt->currentIndex()));
    m_map->setGrid(map.grid);
    m_map->showMap(map.spec);
    m_map->setScale(ScaleKind::Transfer, QCPRange(map.spec.range.lower, map.spec.range.upper), false);
    m_map->resetView(map.grid.columns, map.grid.rows);
}

QString TransferView::cellText(int row, qint64 position) const
{
    if (!m_result || m_prompt->currentIndex() < 0 || row < 0 || std::size_t(row) >= m_result->layers.size() || position < 0)
        return {};
    const std::size_t prompt = std::size_t(m_prompt->currentIndex());
    QString text = tr("<b>%1</b>, position %2<br>").arg(QString::fromStdString(m_result->layers[std::size_t(row)].name)).arg(position);
    const TransferredPositions& t = m_result->prompts[prompt].positions;
    const auto in = [position](const std::vector<PositionRange>& ranges) {
        return std::any_of(ranges.begin(), ranges.end(), [&](const PositionRange& r) { return r.contains(position); });
    };
    if (const BlockFinding* f = transferFindingAt(*m_result, prompt, std::size_t(row), position)) {
        const bool changed = std::find(f->block.changedPositions.begin(), f->block.changedPositions.end(), position) !=
                             f->block.changedPositions.end();
        return text + (changed ? tr("changed") : tr("identical, in a changed block")) +
               tr(" (block %1: the producer's physical %2, the consumer's %3)<br>%4")
                   .arg(f->block.block)
                   .arg(f->block.producerBlock)
                   .arg(f->block.consumerBlock)
                   .arg(QString::fromStdString(f->explanation.sentence).toHtmlEscaped());
    }
    if (in(t.transferred))
        return text + tr("identical: the producer's K and V");
    if (in(t.missing))
        return text + tr("missing: the producer holds it, the consumer does not");
    if (in(t.extra))
        return text + tr("extra: only the consumer holds it");
    if (in(t.local))
        return text + tr("not compared: the consumer computed it itself (its provenance)");
    return text + tr("not compared");
}

void TransferView::showCell(int row, qint64 position)
{
    const QString text = cellText(row, position);
    if (text.isEmpty())
        return;
    m_map->setSelection(row, position);
    m_cell->setText(text);
}

}  // namespace kvscope
