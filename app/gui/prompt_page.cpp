#include "gui/prompt_page.h"

#include "analysis/map_spec.h"
#include "analysis/worst_cells.h"
#include "gui/analysis_controller.h"
#include "gui/drill_down_panel.h"
#include "gui/worst_cells_model.h"
#include "widgets/heatmap_view.h"

#include <QHeaderView>
#include <QLabel>
#include <QTableView>
#include <QTimer>
#include <QToolTip>
#include <QVBoxLayout>

#include <cmath>
#include <utility>

namespace kvscope {

PromptPage::PromptPage(AnalysisController* controller, QWidget* parent)
    : QSplitter(Qt::Horizontal, parent)
    , m_controller(controller)
    , m_heatmap(new HeatmapView)
    , m_drill(new DrillDownPanel)
    , m_worstModel(new WorstCellsModel(this))
    , m_worstView(new QTableView)
    , m_problems(new QLabel)
    , m_poolTimer(new QTimer(this))
    , m_layerTimer(new QTimer(this))
{
    m_worstView->setModel(m_worstModel);
    m_worstView->verticalHeader()->hide();
    m_worstView->setSelectionBehavior(QAbstractItemView::SelectRows);
    m_worstView->horizontalHeader()->setSectionResizeMode(QHeaderView::ResizeToContents);
    m_problems->setWordWrap(true);
    m_problems->setStyleSheet("color: #a00;");
    auto* side = new QWidget;
    auto* sideLayout = new QVBoxLayout(side);
    sideLayout->setContentsMargins(0, 0, 0, 0);
    sideLayout->addWidget(new QLabel(tr("<b>Worst cells</b> (three-way: by error ratio)")));
    sideLayout->addWidget(m_worstView);
    sideLayout->addWidget(m_problems);

    auto* vertical = new QSplitter(Qt::Vertical);
    vertical->addWidget(m_heatmap);
    vertical->addWidget(m_drill);
    vertical->setStretchFactor(0, 3);
    vertical->setStretchFactor(1, 2);
    vertical->setSizes({560, 330});
    addWidget(vertical);
    addWidget(side);
    setStretchFactor(0, 4);
    setStretchFactor(1, 1);

    m_poolTimer->setSingleShot(true);
    m_poolTimer->setInterval(40);  // coalesce zoom and pan into one re-pooling
    connect(m_heatmap, &HeatmapView::cellClicked, this, &PromptPage::selectCell);
    connect(m_heatmap, &HeatmapView::cellHovered, this, &PromptPage::showTooltip);
    connect(m_heatmap, &HeatmapView::visibleTokensChanged, m_poolTimer, qOverload<>(&QTimer::start));
    connect(m_poolTimer, &QTimer::timeout, this, &PromptPage::refreshPooling);
    // Layers finish faster than a map is worth redrawing: the first at once, then at most
    // every 100 ms (each redraw rebuilds the whole grid).
    m_layerTimer->setSingleShot(true);
    m_layerTimer->setInterval(100);
    connect(m_layerTimer, &QTimer::timeout, this, [this] {
        if (std::exchange(m_layerPending, false)) {
            refreshHeatmap();
            m_layerTimer->start();
        }
    });
    connect(m_worstView, &QTableView::clicked, this, [this](const QModelIndex& index) {
        const WorstCell& c = m_worstModel->cell(index.row());
        emit partRequested(c.part);
        selectCell(c.layer, c.token);
    });
}

const PromptAnalysis* PromptPage::prompt() const
{
    const auto result = m_controller->result();
    if (!result || m_settings.prompt < 0 || m_settings.prompt >= int(result->prompts.size()))
        return nullptr;
    return &result->prompts[std::size_t(m_settings.prompt)];
}

void PromptPage::apply(const ViewSettings& settings, bool promptChanged)
{
    m_settings = settings;
    m_heatmap->setScale(scaleOf(settings.map.metric), toQcpRange(settings.range), settings.logarithmic);
    if (promptChanged) {
        m_layer = -1;
        m_heatmap->setSelection(-1, 0);
        if (const PromptAnalysis* p = prompt())
            m_heatmap->resetView(p->tokens, int(p->layers.size()));
        refreshSummary();
    }
    refreshHeatmap();
    refreshDrillDown();
}

void PromptPage::onOpened()
{
    m_layer = -1;
    m_heatmap->setSelection(-1, 0);
    m_drill->clear(tr("click a cell of the heatmap"));
    m_worstModel->setCells(nullptr, {});
    refreshHeatmap();
    if (const PromptAnalysis* p = prompt())
        m_heatmap->resetView(p->tokens, int(p->layers.size()));
    refreshSummary();
}

void PromptPage::onLayerFinished()
{
    if (m_layerTimer->isActive()) {
        m_layerPending = true;
        return;
    }
    refreshHeatmap();
    m_layerTimer->start();
}

void PromptPage::onFinished()
{
    m_layerTimer->stop();
    m_layerPending = false;
    refreshHeatmap();
    refreshSummary();
    if (m_layer >= 0) {
        refreshDrillDown();
    } else if (m_worstModel->rowCount() > 0) {  // start where it is worst
        const WorstCell& c = m_worstModel->cell(0);
        emit partRequested(c.part);
        selectCell(c.layer, c.token);
    }
}

void PromptPage::clear()
{
    m_layer = -1;
    m_fullGrid = {};
    m_heatmap->setGrid({});
    m_heatmap->setSelection(-1, 0);
    m_worstModel->setCells(nullptr, {});
    m_problems->clear();
    m_drill->clear();
}

void PromptPage::refreshHeatmap()
{
    const PromptAnalysis* p = prompt();
    if (!p)
        return;
    const BundleReader& reader = *m_controller->reader();
    m_fullGrid = buildHeatmap(*p, m_settings.map, &m_controller->readyLayers());
    MapSpec spec = promptMapSpec(reader.config(), *p, reader.prompt(p->id), m_settings.map);
    spec.range = m_settings.range;
    m_heatmap->showMap(spec);
    m_heatmap->setScale(spec.scale, toQcpRange(m_settings.range), m_settings.logarithmic);
    refreshPooling();
}

void PromptPage::refreshPooling()
{
    if (m_fullGrid.rows == 0)
        return;
    // Downsample for display: the worst value of each run of tokens that shares a pixel column.
    const QCPRange r = m_heatmap->xAxis->range();
    const qint64 from = std::max<qint64>(0, qint64(std::floor(r.lower)));
    const qint64 to = std::min<qint64>(m_fullGrid.columns, qint64(std::ceil(r.upper)) + 1);
    const qint64 pixels = std::max(100, m_heatmap->axisRect()->width());
    m_heatmap->setGrid(poolColumns(m_fullGrid, from, std::max(to, from + 1), pixels, lowerIsWorse(m_settings.map.metric)));
}

void PromptPage::selectCell(int layer, qint64 token)
{
    const PromptAnalysis* p = prompt();
    if (!p || layer < 0 || layer >= int(p->layers.size()) || token < 0 || token >= p->tokens)
        return;
    m_layer = layer;
    m_token = token;
    m_heatmap->setSelection(layer, token);
    refreshDrillDown();
}

void PromptPage::refreshDrillDown()
{
    const PromptAnalysis* p = prompt();
    if (!p || m_layer < 0) {
        m_drill->clear(tr("click a cell of the heatmap"));
        return;
    }
    if (!m_controller->layerReady(m_layer)) {
        m_drill->clear(tr("this layer is not analysed yet"));
        return;
    }
    m_drill->showCell(m_controller->reader(), m_controller->result(), m_settings.prompt, m_settings.map, m_layer, m_token);
}

void PromptPage::refreshSummary()
{
    const PromptAnalysis* p = prompt();
    if (!p)
        return;
    if (!m_controller->isRunning())
        m_worstModel->setCells(p, kvscope::worstCells(*p, 100));
    // Problems are appended by the workers while they run: read them once the analysis is over.
    QStringList problems;
    for (const std::string& s : m_controller->result()->problems)
        problems << QString::fromStdString(s);
    if (!m_controller->isRunning()) {
        for (const std::string& s : p->problems)
            problems << QString::fromStdString(s);
        if (!p->nonFinite.empty())
            problems << tr("%1 cell(s) hold NaN or infinity in their input").arg(p->nonFinite.size());
    }
    m_problems->setText(problems.isEmpty() ? QString() : tr("<b>Could not analyse everything:</b><br>") + problems.join("<br>"));
}

void PromptPage::showTooltip(int row, qint64 token, const QPoint& globalPos)
{
    const PromptAnalysis* p = prompt();
    if (!p || !m_controller->layerReady(row))
        return;
    const HeatmapSpec& s = m_settings.map;
    int head = -1;
    const float value = heatmapValue(*p, s, row, token, &head);
    const PromptInfo& info = m_controller->reader()->prompt(p->id);
    QString text = QString("<b>%1</b><br>token %2").arg(QString::fromStdString(p->layers[std::size_t(row)])).arg(token);
    if (std::size_t(token) < info.tokenStrings.size())
        text += QString(" '%1'").arg(QString::fromStdString(info.tokenStrings[std::size_t(token)]).toHtmlEscaped());
    text += token < p->promptLen ? tr(" (prefill)") : tr(" (decode)");
    text += QString("<br>%1: %2").arg(QString::fromStdString(heatmapMetricName(s.metric)),
                                      std::isnan(value) ? tr("no data") : QString::number(value, 'g', 5));
    if (head >= 0) {
        const Metric m = metricFor(s.part, MetricKind::Linf);
        text += tr("<br>worst head %1: actual L-inf %2").arg(head).arg(p->value(m, row, token, head), 0, 'g', 4);
        if (p->threeWay)
            text += tr(", expected (base) %1").arg(p->value(baseOf(m), row, token, head), 0, 'g', 4);
    }
    if (p->threeWay)
        text += QString("<br>BC K %1, V %2").arg(p->bcValue(KvPart::K, row, token), 0, 'g', 4).arg(p->bcValue(KvPart::V, row, token), 0, 'g', 4);
    QToolTip::showText(globalPos, text, m_heatmap);
}

bool PromptPage::moveSelection(int key)
{
    if (m_layer < 0)
        return false;
    switch (key) {
    case Qt::Key_Left:
        selectCell(m_layer, m_token - 1);
        return true;
    case Qt::Key_Right:
        selectCell(m_layer, m_token + 1);
        return true;
    case Qt::Key_Up:
        selectCell(m_layer - 1, m_token);
        return true;
    case Qt::Key_Down:
        selectCell(m_layer + 1, m_token);
        return true;
    default:
        return false;
    }
}

}  // namespace kvscope
