#include "gui/drill_down_panel.h"

#include "analysis/map_spec.h"
#include "gui/analysis_controller.h"
#include "gui/head_table_model.h"
#include "metrics/error_histogram.h"
#include "widgets/histogram_view.h"
#include "widgets/token_line_view.h"

#include <QCheckBox>
#include <QGridLayout>
#include <QHeaderView>
#include <QLabel>
#include <QScreen>
#include <QScrollBar>
#include <QSortFilterProxyModel>
#include <QTableView>
#include <QVBoxLayout>

namespace kvscope {

DrillDownPanel::DrillDownPanel(AnalysisController& controller, QWidget* parent)
    : QSplitter(Qt::Horizontal, parent)
    , m_headModel(new HeadTableModel(this))
    , m_headProxy(new QSortFilterProxyModel(this))
    , m_headView(new QTableView)
    , m_floor(new QLabel)
    , m_headMarks(new QLabel)
    , m_histogram(new HistogramView)
    , m_logCounts(new QCheckBox(tr("log counts")))
    , m_logErrors(new QCheckBox(tr("log errors")))
    , m_wholeSequence(new QCheckBox(tr("all tokens")))
    , m_line(new TokenLineView)
    , m_controller(controller)
{
    setObjectName("drillDown");
    m_headProxy->setSourceModel(m_headModel);
    m_headProxy->setSortRole(Qt::UserRole);
    m_headView->setModel(m_headProxy);
    m_headView->setSortingEnabled(true);
    m_headView->setSelectionBehavior(QAbstractItemView::SelectRows);
    m_headView->setSelectionMode(QAbstractItemView::SingleSelection);
    m_headView->setTabKeyNavigation(false);  // Tab leaves the table; arrows move within it
    m_headView->horizontalHeader()->setSectionResizeMode(QHeaderView::ResizeToContents);
    m_headView->verticalHeader()->setDefaultSectionSize(m_headView->fontMetrics().height() + 6);
    m_headView->setWordWrap(false);
    m_headView->horizontalHeader()->setMinimumSectionSize(30);
    m_floor->setWordWrap(true);
    m_logErrors->setChecked(true);
    m_logErrors->setToolTip(tr("Error axis on a log scale: a fault's errors and dtype noise differ by orders of magnitude"));
    m_wholeSequence->setToolTip(tr("The histogram of every token of the layer instead of the selected token"));
    // Tab goes from the head table to the next panel, not through the histogram's options.
    for (QCheckBox* box : {m_logCounts, m_logErrors, m_wholeSequence})
        box->setFocusPolicy(Qt::ClickFocus);

    auto* tableBox = new QWidget;
    auto* tableLayout = new QVBoxLayout(tableBox);
    tableLayout->setContentsMargins(0, 0, 0, 0);
    tableLayout->addWidget(m_floor);
    tableLayout->addWidget(m_headView);
    tableLayout->addWidget(m_headMarks);
    m_headMarks->setObjectName("headMarks");
    m_headMarks->setWordWrap(true);
    m_headMarks->hide();

    auto* histogramBox = new QWidget;
    auto* histogramLayout = new QVBoxLayout(histogramBox);
    histogramLayout->setContentsMargins(0, 0, 0, 0);
    // Two rows: in one the options would keep the drill-down too wide for a 1024-pixel screen.
    auto* options = new QGridLayout;
    options->addWidget(m_logErrors, 0, 0);
    options->addWidget(m_logCounts, 0, 1);
    options->addWidget(m_wholeSequence, 1, 0);
    options->setColumnStretch(2, 1);
    histogramLayout->addLayout(options);
    histogramLayout->addWidget(m_histogram);

    addWidget(tableBox);
    addWidget(histogramBox);
    addWidget(m_line);
    setStretchFactor(0, 4);
    setStretchFactor(1, 3);
    setStretchFactor(2, 3);
    setSizes({480, 250, 230});
    for (int i = 0; i < 3; ++i)
        setCollapsible(i, false);

    connect(m_logCounts, &QCheckBox::toggled, m_histogram, &HistogramView::setLogCounts);
    // Columns sized to their contents once laid out (a sort arrow, wider numbers): fit again.
    connect(m_headView->horizontalHeader(), &QHeaderView::sectionResized, this, &DrillDownPanel::fitHeadTable,
            Qt::QueuedConnection);
    connect(m_logErrors, &QCheckBox::toggled, m_histogram, &HistogramView::setLogErrors);
    connect(m_wholeSequence, &QCheckBox::toggled, this, &DrillDownPanel::requestHistogram);
    connect(m_headView->selectionModel(), &QItemSelectionModel::currentRowChanged, this, [this](const QModelIndex& current) {
        if (!m_selectingRow && current.isValid())
            showHead(m_headProxy->mapToSource(current).row());
    });
    clear(tr("nothing selected"));
}

void DrillDownPanel::clear(const QString& why)
{
    m_result.reset();
    m_layer = -1;
    m_head = -1;
    m_headModel->clear();
    showPartColumns();
    m_floor->setText(why.isEmpty() ? tr("no cell selected") : why);
    ++m_histogramRequest;  // drop a pending histogram
    m_histogram->clearHistogram(why);
    m_line->clearSeries(why);
}

void DrillDownPanel::showCell(std::shared_ptr<const AnalysisResult> result, int promptIndex, const HeatmapSpec& spec,
                              int layer, qint64 token)
{
    const PromptAnalysis& p = result->prompts[std::size_t(promptIndex)];
    const bool sameCell = m_result == result && m_prompt == promptIndex && m_layer == layer && m_token == token;
    int head = m_head;
    if (spec.reduction == HeadReductionKind::OneHead) {
        head = spec.head;
    } else if (!sameCell || head < 0) {  // a new cell starts on its worst head
        heatmapValue(p, spec, layer, token, &head);
        if (head < 0)
            head = 0;
    }
    head = std::min(head, p.headsOf(layer) - 1);  // a layer of fewer heads than the last one
    m_headModel->setCell(result, promptIndex, layer, token);
    m_result = std::move(result);
    m_spec = spec;
    m_prompt = promptIndex;
    m_layer = layer;
    m_token = token;
    showPartColumns();
    const double floor = m_headModel->noiseFloor(spec.part);
    m_floor->setText(QString("<b>%1, token %2</b>").arg(QString::fromStdString(shortLayerName(p.layers[std::size_t(layer)]))).arg(token) +
                     (std::isnan(floor) ? QString()
                                        : tr(" &middot; %1 noise floor %2 &middot; ratio = L-inf / floor")
                                              .arg(QString::fromStdString(partTitle(p, spec.part)))
                                              .arg(floor, 0, 'g', 4)));
    m_floor->setToolTip(tr("The noise floor is the cell's largest base (expected vs baseline) L-inf over heads: "
                           "what bf16 alone does here. A head's ratio is its L-inf over it."));
    m_head = -1;
    showHead(head);
}

void DrillDownPanel::highlightHeads(const std::vector<int>& heads, const QString& whose)
{
    m_headModel->setHighlightedHeads(heads);
    m_headMarks->setText(tr("<span style='background:#fff0aa'>&nbsp;*&nbsp;</span> %1").arg(whose.toHtmlEscaped()));
    m_headMarks->setVisible(!heads.empty());
}

void DrillDownPanel::showPartColumns()
{
    const KvPart other = m_spec.part == KvPart::K ? KvPart::V : KvPart::K;
    for (int c : HeadTableModel::columnsOf(m_spec.part))
        m_headView->setColumnHidden(c, false);
    for (int c : HeadTableModel::columnsOf(other))
        m_headView->setColumnHidden(c, true);
    // Two-way: no baseline, so no ratio and no base columns (they would only say "-").
    const bool threeWay = m_result && m_prompt >= 0 && m_result->prompts[std::size_t(m_prompt)].threeWay;
    for (int c : HeadTableModel::columnsOf(m_spec.part)) {
        const QString header = m_headView->model()->headerData(c, Qt::Horizontal).toString();
        if (!threeWay && (header.contains("base") || header.contains("ratio")))
            m_headView->setColumnHidden(c, true);
    }
    // Sorted by a column now hidden: by the same column of this part, or the rows would keep
    // the other part's order.
    const QHeaderView* header = m_headView->horizontalHeader();
    if (const int i = HeadTableModel::columnsOf(other).indexOf(header->sortIndicatorSection()); i >= 0)
        m_headView->sortByColumn(HeadTableModel::columnsOf(m_spec.part)[i], header->sortIndicatorOrder());
    fitHeadTable();
}

void DrillDownPanel::fitHeadTable()
{
    // The splitter gives the table at least the width of its columns: no horizontal scroll.
    int width = 2 * m_headView->frameWidth() + m_headView->verticalHeader()->sizeHint().width() +
                m_headView->verticalScrollBar()->sizeHint().width();
    // (from the texts, not columnWidth: before the view is laid out it has no visible rows, and
    // its columns are only as wide as their headers)
    const QFontMetrics metrics(m_headView->font());
    for (int c : HeadTableModel::columnsOf(m_spec.part)) {
        if (m_headView->isColumnHidden(c))
            continue;
        int column = std::max(m_headView->columnWidth(c),
                              metrics.horizontalAdvance(m_headProxy->headerData(c, Qt::Horizontal).toString()) + 24);
        for (int row = 0; row < m_headProxy->rowCount(); ++row)
            column = std::max(column, metrics.horizontalAdvance(m_headProxy->index(row, c).data().toString()) + 16);
        width += column;
    }
    // Unless the window would then be wider than the screen: the side panel (225), the histogram
    // and the line plot (130 each), their handles, margins and the window's frame need ~540
    // pixels beside it, which leaves a 1024-pixel screen room for a three-way table's columns.
    const int room = m_headView->screen()->availableGeometry().width() - 540;
    m_headView->setMinimumWidth(std::max(std::min(width, room), 200));
}

void DrillDownPanel::showHead(int head)
{
    if (!m_result || m_layer < 0 || head < 0 || head >= m_result->prompts[std::size_t(m_prompt)].headsOf(m_layer) || head == m_head)
        return;
    m_head = head;
    m_selectingRow = true;
    m_headView->selectRow(m_headProxy->mapFromSource(m_headModel->index(head, 0)).row());
    m_selectingRow = false;
    showLine();
    requestHistogram();
}

void DrillDownPanel::showLine()
{
    // The per-token line: the chosen metric of this layer and head across the sequence.
    const PromptAnalysis& p = m_result->prompts[std::size_t(m_prompt)];
    const MetricKind kind = m_spec.metric == HeatmapMetric::RelL2 ? MetricKind::L2
                          : m_spec.metric == HeatmapMetric::OneMinusCos ? MetricKind::Cos : MetricKind::Linf;
    const Metric metric = metricFor(m_spec.part, kind);
    const auto shown = [&](float v) { return kind == MetricKind::Cos ? 1.0 - v : double(v); };
    QVector<double> actual, base;
    for (qint64 t = 0; t < p.tokens; ++t) {
        actual << shown(p.value(metric, m_layer, t, m_head));
        if (p.threeWay)
            base << shown(p.value(baseOf(metric), m_layer, t, m_head));
    }
    QVector<double> divergences;
    for (const Divergence& d : p.divergences)
        divergences << double(d.position);
    m_line->setSeries(actual, base,
                      p.heads == 1 ? QString::fromStdString(shortLayerName(p.layers[std::size_t(m_layer)]))  // one latent
                                   : QString("%1, head %2").arg(QString::fromStdString(shortLayerName(p.layers[std::size_t(m_layer)]))).arg(m_head),
                      QString("%1 %2").arg(QString::fromStdString(partName(p, m_spec.part)), kind == MetricKind::Cos ? "1 - cos"
                                                                    : kind == MetricKind::L2 ? "rel. L2" : "rel. L-inf"),
                      double(p.promptLen) - 0.5, divergences, m_token);
}

void DrillDownPanel::requestHistogram()
{
    if (!m_result || m_layer < 0 || m_head < 0)
        return;
    const PromptAnalysis& p = m_result->prompts[std::size_t(m_prompt)];
    const bool whole = m_wholeSequence->isChecked();
    const qint64 begin = whole ? 0 : m_token, end = whole ? p.tokens : m_token + 1;
    m_histogramTitle = QString("%1%2, %3")
                           .arg(p.heads == 1 ? QString() : QString("head %1 ").arg(m_head))  // an MLA latent has one
                           .arg(QString::fromStdString(partTitle(p, m_spec.part)), whole ? tr("all tokens") : tr("token %1").arg(m_token));
    m_histogram->clearHistogram(tr("reading %1").arg(m_histogramTitle));
    const int request = ++m_histogramRequest;
    // Read off the GUI thread. Safe for `this`: the controller is the window's first child, so it
    // goes (joining its tasks, dropping what they posted) before the pages and this panel.
    m_controller.requestHeadHistogram(p.id, p.layers[std::size_t(m_layer)], m_head, m_spec.part, begin, end,
                                      [this, request](std::shared_ptr<const HeadErrorHistogram> histogram,
                                                      const QString& error) { showHistogram(request, histogram, error); });
}

void DrillDownPanel::showHistogram(int request, const std::shared_ptr<const HeadErrorHistogram>& histogram,
                                   const QString& error)
{
    if (request != m_histogramRequest)
        return;  // dropped: the selection changed since
    if (histogram)
        m_histogram->setHistogram(*histogram, m_histogramTitle);
    else  // e.g. the file was truncated or replaced since it was opened
        m_histogram->clearHistogram(tr("no histogram: %1").arg(error));
    emit histogramShown();
}

}  // namespace kvscope
