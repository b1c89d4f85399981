#include "gui/prompt_page.h"

#include "analysis/impact_view_text.h"
#include "analysis/map_spec.h"
#include "analysis/state_rows.h"
#include "analysis/source_summary.h"
#include "analysis/off_floor.h"
#include "analysis/suspect.h"
#include "analysis/worst_cells.h"
#include "gui/analysis_controller.h"
#include "gui/drill_down_panel.h"
#include "gui/worst_cells_model.h"
#include "widgets/heatmap_view.h"
#include "widgets/impact_column.h"
#include "widgets/provenance_strip.h"
#include "widgets/histogram_view.h"
#include "widgets/state_strip.h"

#include <QElapsedTimer>
#include <QFileInfo>
#include <QHeaderView>
#include <QLabel>
#include <QListWidget>
#include <QShortcut>
#include <QSignalBlocker>
#include <QMenu>
#include <QTableView>
#include <QTimer>
#include <QToolTip>
#include <QHBoxLayout>
#include <QVBoxLayout>

#include <algorithm>
#include <cmath>
#include <optional>
#include <utility>

namespace kvscope {

namespace {

// The structure a prompt's suspect's off positions follow: its own (a chunk boundary), or the
// one the pooled suspect of its pattern and layer found across the prompts (the last block's
// fill), which the prompt's own suspect does not carry.
const StructuralFinding* structureOf(const Suspect& s, const std::vector<Suspect>& pooled, const std::string& prompt)
{
    if (s.structure)
        return &*s.structure;
    for (const Suspect& q : pooled)
        if (q.structure && q.pattern == s.pattern && q.firstLayer == s.firstLayer &&
            std::find(q.prompts.begin(), q.prompts.end(), prompt) != q.prompts.end())
            return &*q.structure;
    return nullptr;
}

// What the suspect does to the output, said apart from its evidence (empty: not measured).
QString impactSentence(const Suspect& s)
{
    return s.impact ? QObject::tr("Output: %1").arg(QString::fromStdString(s.impact->text)) : QString();
}

// A suspect's evidence with the structure's sentence, when the evidence does not say it.
QString evidenceWith(const Suspect& s, const StructuralFinding* structure)
{
    std::string text = s.evidence;
    if (structure && text.find(structure->text) == std::string::npos)
        text += " " + structure->text;
    return QString::fromStdString(text);
}

}  // namespace

PromptPage::PromptPage(AnalysisController* controller, QWidget* parent)
    : QSplitter(Qt::Horizontal, parent)
    , m_controller(controller)
    , m_heatmap(new HeatmapView)
    , m_provenance(new ProvenanceStrip(m_heatmap))
    , m_stateStrip(new StateStrip(m_heatmap))
    , m_impact(new ImpactColumn(m_heatmap))
    , m_drill(new DrillDownPanel(*controller))
    , m_vertical(new QSplitter(Qt::Vertical))
    , m_worstModel(new WorstCellsModel(this))
    , m_worstView(new QTableView)
    , m_worstTitle(new QLabel)
    , m_suspects(new QListWidget)
    , m_evidence(new QLabel)
    , m_suspectImpact(new QLabel)
    , m_problems(new QLabel)
    , m_notCompared(new QLabel)
    , m_replicas(new QLabel)
    , m_poolTimer(new QTimer(this))
    , m_layerTimer(new QTimer(this))
{
    layOut();
    connectViews();
    connect(controller, &AnalysisController::rowStarted, this, &PromptPage::showRowStart);
    clear(tr("Open a capture bundle: File > Open (Ctrl+O), or drop one here"));
}

// The map above the drill-down, the suspects, worst cells and notes beside them.
void PromptPage::layOut()
{
    setObjectName("promptPage");
    m_vertical->setObjectName("mapAndDrillDown");
    m_worstView->setModel(m_worstModel);
    m_worstView->verticalHeader()->hide();
    m_worstView->setSelectionBehavior(QAbstractItemView::SelectRows);
    m_worstView->setSelectionMode(QAbstractItemView::SingleSelection);
    m_worstView->setTabKeyNavigation(false);
    m_worstView->setWordWrap(false);
    m_worstView->horizontalHeader()->setSectionResizeMode(QHeaderView::ResizeToContents);
    m_worstView->horizontalHeader()->setMinimumSectionSize(36);
    m_worstView->verticalHeader()->setDefaultSectionSize(m_worstView->fontMetrics().height() + 6);
    m_worstTitle->setWordWrap(true);
    m_problems->setWordWrap(true);
    m_problems->setStyleSheet("color: #a00;");
    m_replicas->setObjectName("replicaDifferences");
    m_replicas->setWordWrap(true);
    m_replicas->setStyleSheet("color: #b2182b;");
    m_notCompared->setObjectName("notCompared");
    m_notCompared->setWordWrap(true);
    m_notCompared->setStyleSheet("color: #555;");
    auto* side = new QWidget;
    side->setMinimumWidth(225);  // the window fits a 1024-pixel screen
    auto* sideLayout = new QVBoxLayout(side);
    sideLayout->setContentsMargins(0, 0, 0, 0);
    m_evidence->setWordWrap(true);
    m_evidence->setTextInteractionFlags(Qt::TextSelectableByMouse);
    m_suspectImpact->setObjectName("suspectImpact");
    m_suspectImpact->setWordWrap(true);
    m_suspectImpact->setTextFormat(Qt::PlainText);
    m_suspectImpact->setTextInteractionFlags(Qt::TextSelectableByMouse);
    m_suspects->setMaximumHeight(80);
    m_suspects->setToolTip(tr("Where the engine first leaves the noise floor, and what kind of bug it looks like"));
    sideLayout->addWidget(new QLabel(tr("<b>Suspects</b>")));
    sideLayout->addWidget(m_suspects);
    sideLayout->addWidget(m_evidence);
    sideLayout->addWidget(m_suspectImpact);
    sideLayout->addWidget(m_worstTitle);
    sideLayout->addWidget(m_worstView);
    sideLayout->addWidget(m_problems);
    sideLayout->addWidget(m_replicas);
    sideLayout->addWidget(m_notCompared);

    // The strip under the map shares its token axis: both start at the box's left edge.
    auto* mapAndStrip = new QWidget;
    auto* mapLayout = new QVBoxLayout(mapAndStrip);
    mapLayout->setContentsMargins(0, 0, 0, 0);
    mapLayout->setSpacing(0);
    // The impact column beside the map shares its layer axis: both start at the same top.
    auto* mapAndImpact = new QHBoxLayout;
    mapAndImpact->setContentsMargins(0, 0, 0, 0);
    mapAndImpact->setSpacing(0);
    mapAndImpact->addWidget(m_heatmap, 1);
    mapAndImpact->addWidget(m_impact);
    mapLayout->addLayout(mapAndImpact, 1);
    mapLayout->addWidget(m_provenance);
    mapLayout->addWidget(m_stateStrip);
    connect(m_stateStrip, &StateStrip::checkpointClicked, this,
            [this](const QString& text, const QString& layer, qint64 position, const QString& part, qint64 cell) {
                showStateCheckpoint(text, layer, position, part, cell);
            });
    m_vertical->addWidget(mapAndStrip);
    m_vertical->addWidget(m_drill);
    m_vertical->setStretchFactor(0, 3);
    m_vertical->setStretchFactor(1, 2);
    m_vertical->setSizes({450, 300});
    m_vertical->setCollapsible(0, false);
    addWidget(m_vertical);
    addWidget(side);
    setStretchFactor(0, 4);
    setStretchFactor(1, 1);
    setCollapsible(0, false);
    setSizes({1000, 320});
}

// What the map, the worst cells and the suspects do when used.
void PromptPage::connectViews()
{
    m_poolTimer->setSingleShot(true);
    m_poolTimer->setInterval(40);  // coalesce zoom and pan into one re-pooling
    connect(m_heatmap, &HeatmapView::cellClicked, this, &PromptPage::selectCell);
    connect(m_heatmap, &HeatmapView::cellHovered, this, [this](int row, qint64 token, const QPoint& at) {
        QString text = cellTooltip(row, token);
        const HeatmapGrid& shown = m_heatmap->grid();
        if (!text.isEmpty() && shown.tokensPerColumn > 1 && row < shown.rows) {
            // Zoomed out, a pixel column shows the worst of its tokens.
            const qint64 column = (token - shown.firstToken) / shown.tokensPerColumn;
            const qint64 first = shown.firstToken + column * shown.tokensPerColumn;
            if (column >= 0 && column < shown.columns)
                text += tr("<br><i>this column shows the worst of tokens %1-%2: %3</i>")
                            .arg(first)
                            .arg(first + shown.tokensPerColumn - 1)
                            .arg(shown.at(row, column), 0, 'g', 4);
        }
        if (!text.isEmpty())
            QToolTip::showText(at, text, m_heatmap);
    });
    connect(m_heatmap, &HeatmapView::visibleTokensChanged, m_poolTimer, qOverload<>(&QTimer::start));
    connect(m_heatmap, &HeatmapView::keyPressed, this, [this](int key) {
        if (key == Qt::Key_Escape)
            clearSelection();
        else if (key == Qt::Key_Return || key == Qt::Key_Enter)
            m_drill->headView().setFocus(Qt::OtherFocusReason);  // on to the selected cell's heads
        else if (m_layer < 0)
            selectCell(0, 0);  // the first arrow press starts at the top left
        else
            moveSelection(key);
    });
    connect(m_heatmap, &HeatmapView::contextMenuRequested, this, &PromptPage::showContextMenu);
    connect(m_poolTimer, &QTimer::timeout, this, &PromptPage::refreshPooling);
    // Layers finish faster than a map is worth redrawing: the first at once, then at most
    // every 100 ms, and no more often than keeps the redraws (each rebuilds the whole grid:
    // ~20 ms at 160 layers) to a twentieth of the time: the analysis has every core, and the
    // map would otherwise fall behind `analyze` by what the redraws take from it
    // (redrawWhileAnalysing sets the pause).
    m_layerTimer->setSingleShot(true);
    connect(m_layerTimer, &QTimer::timeout, this, [this] {
        if (std::exchange(m_layerPending, false))
            redrawWhileAnalysing();
    });
    // The list follows the keyboard: moving the highlight shows that cell; Enter goes to the map.
    // It follows the selection, not the current row: tabbing into the list makes its first
    // row current (without selecting it), which must not change the cell.
    connect(m_worstView->selectionModel(), &QItemSelectionModel::selectionChanged, this, [this] {
        const QModelIndexList rows = m_worstView->selectionModel()->selectedRows();
        if (!rows.isEmpty())
            followWorstCell(rows.first().row());
    });
    connect(m_worstView, &QTableView::activated, this, [this](const QModelIndex& index) {
        followWorstCell(index.row());
        m_heatmap->setFocus();
    });
    connect(m_worstView, &QTableView::clicked, this, [this](const QModelIndex& index) { followWorstCell(index.row()); });
    connect(m_suspects, &QListWidget::currentRowChanged, this, &PromptPage::followSuspect);
    // A click on the suspect already chosen goes back to its cell and marks too.
    connect(m_suspects, &QListWidget::itemClicked, this, [this](QListWidgetItem* item) { followSuspect(m_suspects->row(item)); });
    connect(m_suspects, &QListWidget::itemActivated, this, [this] { m_heatmap->setFocus(); });
    connectPanelKeys();
}

// F6 / Shift+F6 go from panel to panel (map, heads, suspects, worst cells) in one press, where
// Tab visits every control; Esc in a panel goes back to the map, the cell still selected.
void PromptPage::connectPanelKeys()
{
    const QList<QWidget*> panels{m_heatmap, &m_drill->headView(), m_suspects, m_worstView};
    const auto step = [this, panels](int by) {
        qsizetype at = 0;
        for (qsizetype i = 0; i < panels.size(); ++i)
            if (panels[i] == focusWidget() || panels[i]->isAncestorOf(focusWidget()))
                at = i;
        panels[(at + by + panels.size()) % panels.size()]->setFocus(Qt::TabFocusReason);
    };
    connect(new QShortcut(QKeySequence(Qt::Key_F6), this, nullptr, nullptr, Qt::WidgetWithChildrenShortcut),
            &QShortcut::activated, this, [step] { step(1); });
    connect(new QShortcut(QKeySequence(Qt::SHIFT | Qt::Key_F6), this, nullptr, nullptr, Qt::WidgetWithChildrenShortcut),
            &QShortcut::activated, this, [step] { step(-1); });
    for (QWidget* panel : {static_cast<QWidget*>(m_drill), static_cast<QWidget*>(m_suspects), static_cast<QWidget*>(m_worstView)})
        connect(new QShortcut(QKeySequence(Qt::Key_Escape), panel, nullptr, nullptr, Qt::WidgetWithChildrenShortcut),
                &QShortcut::activated, this, [this] { m_heatmap->setFocus(Qt::OtherFocusReason); });
}

const PromptAnalysis* PromptPage::prompt() const
{
    const auto result = m_controller->result();
    if (!result || m_settings.prompt < 0 || m_settings.prompt >= int(result->prompts.size()))
        return nullptr;
    return &result->prompts[std::size_t(m_settings.prompt)];
}

void PromptPage::applyView(const ViewSettings& settings, bool promptChanged)
{
    if (promptChanged || !(settings.map == m_settings.map))
        m_rowStart = {};  // of another map
    m_settings = settings;
    m_controller->followMap(settings.prompt, settings.map);
    if (promptChanged) {
        m_layer = -1;
        m_heatmap->setSelection(-1, 0);
        if (const PromptAnalysis* p = prompt())
            m_heatmap->resetView(p->tokens, int(p->layers.size()));
        refreshSummary();
    }
    refreshHeatmap();
    if (promptChanged && m_layer < 0)
        selectWorstCell();  // a new prompt starts where it is worst, as a new bundle does
    refreshDrillDown();
}

void PromptPage::captureOpened()
{
    ++m_opening;
    m_rowStart = {};
    m_layerTimer->stop();  // a pause left from the previous bundle's analysis
    m_layerPending = false;
    m_layer = -1;
    m_cancelled = false;
    m_heatmap->setSelection(-1, 0);
    m_drill->clear(tr("click a cell of the heatmap"));
    m_worstModel->setCells(nullptr, {});
    refreshHeatmap();
    if (const PromptAnalysis* p = prompt())
        m_heatmap->resetView(p->tokens, int(p->layers.size()));
    refreshSummary();
}

void PromptPage::layerAnalysed(int)
{
    if (m_layerTimer->isActive()) {
        m_layerPending = true;
        return;
    }
    redrawWhileAnalysing();
}

void PromptPage::showRowStart(int layer, int prompt, const HeatmapSpec& spec, std::shared_ptr<const HeatmapGrid> row)
{
    if (prompt != m_settings.prompt || !(spec == m_settings.map) || m_controller->layerReady(layer))
        return;
    m_rowStart = {layer, std::move(row)};
    layerAnalysed(layer);
}

void PromptPage::captureOpening(const QString& path, bool kept)
{
    if (!kept)  // (a finished analysis stays on screen until this one opens: it may fail to)
        clear(tr("Opening %1 ...").arg(QFileInfo(path).fileName()));
}

bool PromptPage::mapUpToDate() const
{
    return !m_controller->door().busy("prompt map") && !m_controller->door().busy("stored map window");
}

void PromptPage::redrawWhileAnalysing()
{
    if (m_stored)
        return;  // a results file's map has every row from the start
    refreshHeatmap();
    m_layerTimer->start(int(std::clamp<qint64>(qint64(20000 * m_buildSeconds), 100, 2000)));
}

void PromptPage::captureAnalysed()
{
    m_layerTimer->stop();
    m_layerPending = false;
    if (const auto result = m_controller->result(); result && result->prompts.empty()) {
        // No map to show (every prompt broken, or an engine-only capture): why, where the map would be.
        QStringList why;
        for (const std::string& s : result->problems)
            why << QString::fromStdString(s);
        clear(tr("Nothing could be analysed.\n\n%1").arg(why.join("\n\n")));
        return;
    }
    refreshHeatmap();
    refreshSummary();
    if (m_layer >= 0)
        refreshDrillDown();
    else
        selectWorstCell();
}

void PromptPage::analysisCancelled()
{
    // The layers done so far are final: show them, rank their cells, mark the rest (the
    // start of the one cut short too: it was not analysed).
    m_cancelled = true;
    m_rowStart = {};
    captureAnalysed();
}

void PromptPage::selectWorstCell()
{
    // Start where the bug is: the first suspect, else the worst cell.
    if (m_suspects->count() > 0)
        m_suspects->setCurrentRow(0);
    else if (m_worstModel->rowCount() > 0)
        followWorstCell(0);
}

QString PromptPage::suspectEvidence() const
{
    return m_evidence->text();
}

QString PromptPage::suspectImpact() const
{
    return m_suspectImpact->text();
}

void PromptPage::followSuspect(int row)
{
    const PromptAnalysis* p = prompt();
    if (!p || m_controller->isRunning() || row < 0 || row >= int(p->suspects.size()))
        return;
    const Suspect s = p->suspects[std::size_t(row)];
    m_evidence->setText(evidenceWith(s, structureOf(s, m_controller->result()->suspects, p->id)));
    m_suspectImpact->setText(impactSentence(s));
    emit partRequested(s.worstPart);
    // Its tokens over the rows of the layers it reaches.
    int top = s.worstLayer, bottom = s.worstLayer;
    for (const std::string& name : s.layers) {
        const auto it = std::find(p->layers.begin(), p->layers.end(), name);
        if (it != p->layers.end()) {
            top = std::min(top, int(it - p->layers.begin()));
            bottom = std::max(bottom, int(it - p->layers.begin()));
        }
    }
    m_heatmap->setHighlight({double(s.firstToken) - 0.5, double(top) - 0.5, double(s.lastToken) + 0.5, double(bottom) + 0.5});
    selectCell(s.worstLayer, s.worstToken);
    m_drill->showHead(s.worstHead);
    markSuspectHeads(&s);
    pinRowLabels();
}

void PromptPage::markSuspectHeads(const Suspect* s)
{
    if (!s || s->heads.empty()) {
        m_drill->highlightHeads({});
        return;
    }
    m_drill->highlightHeads(s->heads, tr("the suspect's heads (%1, from %2)")
                                          .arg(suspectPatternName(s->pattern))
                                          .arg(QString::fromStdString(shortLayerName(s->firstLayer))));
}

void PromptPage::pinRowLabels()
{
    QList<int> rows;
    if (m_layer >= 0)
        rows << m_layer;
    const PromptAnalysis* p = prompt();
    const int suspect = std::max(m_suspects->currentRow(), 0);
    if (p && !m_controller->isRunning() && suspect < int(p->suspects.size())) {
        const Suspect& s = p->suspects[std::size_t(suspect)];
        rows << s.worstLayer;
        const auto first = std::find(p->layers.begin(), p->layers.end(), s.firstLayer);
        if (first != p->layers.end())
            rows << int(first - p->layers.begin());
    }
    m_heatmap->setPinnedRows(rows);
}

void PromptPage::followWorstCell(int row)
{
    if (row < 0 || row >= m_worstModel->rowCount() || m_followingList)
        return;
    const WorstCell c = m_worstModel->cell(row);
    m_followingList = true;  // switching K/V rebuilds views, not this list
    emit partRequested(c.part);
    selectCell(c.layer, c.token);
    m_worstView->selectRow(row);
    m_followingList = false;
}

void PromptPage::showStateCheckpoint(const QString& text, const QString& layer, qint64 position, const QString& part,
                                     qint64 cell)
{
    const PromptAnalysis* p = prompt();
    if (!p)
        return;
    m_evidence->setText(text);
    m_suspectImpact->clear();
    // Its worst cell's values against the reference, as the drill-down shows a KV head's.
    const QString title = tr("%1 %2 %3 %4, the state after position %5")
                              .arg(layer, part, part == "ssm" ? tr("head") : tr("cell")).arg(cell).arg(position);
    m_drill->histogram().clearHistogram(tr("reading %1").arg(title));
    m_controller->requestStateHistogram(p->id, layer.toStdString(), position, part.toStdString(), cell,
                                        [this, title](std::shared_ptr<const HeadErrorHistogram> histogram, const QString& error) {
                                            if (histogram)
                                                m_drill->histogram().setHistogram(*histogram, title);
                                            else
                                                m_drill->histogram().clearHistogram(tr("no histogram: %1").arg(error));
                                        });
}

void PromptPage::clear(const QString& message)
{
    m_layer = -1;
    m_map = {};
    m_stored.reset();
    m_rowStart = {};
    m_rowStartShown = 0;
    ++m_opening;  // a map still being built is of what was open
    m_heatmap->showEmpty(message);
    m_provenance->setProvenance({});
    m_stateStrip->setStates({}, {});
    m_impact->setImpacts({});
    m_worstModel->setCells(nullptr, {});
    m_suspects->clear();
    m_evidence->clear();
    m_suspectImpact->clear();
    m_heatmap->setHighlight({});
    m_heatmap->setPinnedRows({});
    m_worstTitle->setText(tr("<b>Worst cells</b>"));

    m_problems->clear();
    m_replicas->clear();
    m_notCompared->clear();
    m_drill->clear(tr("nothing open"));
}

struct PromptPage::BuiltMap {
    int opening = 0;  // of m_opening when asked for: a map of a bundle since closed is not shown
    HeatmapPyramid map;
    std::shared_ptr<const StoredMap> stored;  // instead of `map`: the results file's, read as shown
    MapSpec spec;
    bool logarithmic = false;
    std::vector<char> ready;
    RowStart rowStart;  // drawn over its row, which is not ready
    std::vector<double> offThresholds;  // [layer], for a map in floors (its values are divided by them)
    // The state-space layers' rows under the map (compared once every layer is: when finished).
    std::vector<StateRow> stateRows;
    std::vector<StateLayerAnalysis> states;
};

void PromptPage::refreshHeatmap()
{
    const PromptAnalysis* p = prompt();
    if (!p)
        return;
    // Only finished layers are read: the others are still being written by the analysis. A
    // results file's map is read from the file, a window at a time, without its arrays. (A
    // build going on is replaced: its map is not shown.)
    m_controller->door().ask("prompt map", this, [this, result = m_controller->result(), loader = m_controller->loader(),
                                                  index = m_settings.prompt, settings = m_settings,
                                                  ready = m_controller->readyLayers(), opening = m_opening,
                                                  resultsFile = m_controller->resultsFile().toStdString(),
                                                  rowStart = m_rowStart, suspects = m_controller->recorded().suspects,
                                                  finished = !m_controller->isRunning()](EngineJob& job) {
        QElapsedTimer took;
        took.start();
        auto built = std::make_shared<BuiltMap>();
        built->opening = opening;
        built->logarithmic = settings.logarithmic;
        const PromptAnalysis& p = result->prompts[std::size_t(index)];
        std::optional<StoredMap> stored;
        if (!resultsFile.empty()) {
            try {
                stored = StoredMap::open(resultsFile, std::size_t(index), settings.map, int(p.layers.size()), p.tokens);
            } catch (const std::exception&) {  // a damaged map: built from the arrays (checked as they are read)
            }
        }
        // In floors, drawn in units of each layer's off threshold (a results file keeps it with its map).
        if (scaleOf(settings.map.metric) == ScaleKind::Ratio) {
            if (stored && !stored->offThreshold())
                stored.reset();  // a file from before it was kept: built from the arrays
            built->offThresholds = stored ? std::vector<double>(p.layers.size(), *stored->offThreshold())
                                          : mapOffThresholds(p, suspects, &ready);
            if (finished)  // (the suspects are written when the analysis is over)
                useSuspectThresholds(p, suspects, &ready, built->offThresholds);
        }
        // The data's colour range: the results file keeps it for its maps (computing it reads every cell).
        const auto range = [&](bool logarithmic) {
            if (stored && stored->dataRange(logarithmic))
                return *stored->dataRange(logarithmic);
            return dataRange(p, settings.map, logarithmic, &ready);
        };
        if (stored) {
            built->stored = std::make_shared<const StoredMap>(std::move(*stored));
            built->ready.assign(p.layers.size(), 1);  // every analysed row is in the file
        } else {
            HeatmapGrid grid = buildHeatmap(p, settings.map, &ready);
            if (rowStart.row && rowStart.layer >= 0 && rowStart.layer < grid.rows && !ready[std::size_t(rowStart.layer)]) {
                const std::size_t at = std::size_t(rowStart.layer) * std::size_t(grid.columns);
                std::copy(rowStart.row->values.begin(), rowStart.row->values.end(), grid.values.begin() + std::ptrdiff_t(at));
                std::copy(rowStart.row->heads.begin(), rowStart.row->heads.end(), grid.heads.begin() + std::ptrdiff_t(at));
                built->rowStart = rowStart;
            }
            if (!built->offThresholds.empty())
                divideRows(grid, built->offThresholds);
            built->map = HeatmapPyramid(std::move(grid), lowerIsWorse(settings.map.metric));
            built->ready = ready;
        }
        built->spec = promptMapSpec(loader->config(), p, loader->prompt(p.id), settings.map, finished);
        if (finished) {
            built->states = p.states;
            built->stateRows = stateRows(p);
        }
        ValueRange shownRange = settings.range;
        if (settings.autoRange)
            shownRange = range(settings.logarithmic);
        else if (settings.logarithmic && !(shownRange.lower > 0))  // a log scale cannot start at 0: from the data's smallest values
            shownRange.lower = std::min(range(true).lower, shownRange.upper / 10);
        built->spec.range = shownRange;
        const double seconds = took.nsecsElapsed() / 1e9;
        job.deliver([this, built, seconds] {
            m_buildSeconds = seconds;
            if (built->opening == m_opening)
                showHeatmap(*built);
        });
    });
}

void PromptPage::showHeatmap(BuiltMap& built)
{
    m_offThresholds = std::move(built.offThresholds);
    m_map = std::move(built.map);
    m_stored = std::move(built.stored);
    m_storedGridShown = false;
    if (m_settings.autoRange)
        emit autoRangeChosen(built.spec.range);
    m_heatmap->showMap(built.spec);
    m_provenance->setProvenance(built.spec.provenance);
    m_stateStrip->setStates(std::move(built.stateRows), std::move(built.states));
    m_heatmap->setScale(built.spec.scale, toQcpRange(built.spec.range), built.logarithmic);
    m_rowStartShown = built.rowStart.row ? built.rowStart.row->columns : 0;
    m_heatmap->setPendingRows(built.ready, m_cancelled ? tr("not analysed (cancelled)") : tr("analysing..."),
                              built.rowStart.layer, built.rowStart.row ? built.rowStart.row->columns : 0);
    refreshPooling();
    if (!m_stored)
        emit mapShown();  // (a stored map's when its first window is drawn)
}

void PromptPage::refreshPooling()
{
    if (m_stored) {
        readStoredWindow();
        return;
    }
    if (m_map.empty())
        return;
    // Downsample for display: the worst value of each run of tokens that shares a pixel column,
    // from the pyramid's copy at about this zoom (the cost is the pixels, not the tokens).
    const auto [from, to, pixels] = shownTokens();
    m_heatmap->setGrid(m_map.window(from, to, pixels));
}

std::tuple<qint64, qint64, qint64> PromptPage::shownTokens() const
{
    const QCPRange r = m_heatmap->xAxis->range();
    const qint64 from = std::max<qint64>(0, qint64(std::floor(r.lower)));
    const qint64 to = qint64(std::ceil(r.upper)) + 1;
    const qint64 pixels = std::max(100, m_heatmap->axisRect()->width());
    return {from, to, pixels};
}

void PromptPage::readStoredWindow()
{
    // One read at a time: the newest view is read when the one going ends.
    const auto [from, to, pixels] = shownTokens();
    m_controller->door().ask("stored map window", this, [this, map = m_stored, from, to, pixels,
                                                         thresholds = m_offThresholds](EngineJob& job) {
        auto grid = std::make_shared<HeatmapGrid>();
        QString error;
        try {
            *grid = map->window(from, to, pixels);
            if (!thresholds.empty())
                divideRows(*grid, thresholds);
        } catch (const std::exception& e) {
            error = QString::fromStdString(e.what());
        }
        job.deliver([this, map, grid, error] {
            if (map == m_stored) {
                if (!error.isEmpty()) {
                    m_heatmap->showEmpty(tr("The map cannot be read from the results file:\n%1").arg(error));
                    m_stored.reset();
                    return;
                }
                m_heatmap->setGrid(*grid);
                if (!std::exchange(m_storedGridShown, true))
                    emit mapShown();
            }
        });
    });
}

void PromptPage::selectCell(int layer, qint64 token)
{
    const PromptAnalysis* p = prompt();
    if (!p || layer < 0 || layer >= int(p->layers.size()) || token < 0 || token >= p->tokens)
        return;
    m_layer = layer;
    m_token = token;
    m_heatmap->setSelection(layer, token);
    m_heatmap->ensureVisible(layer, token);
    pinRowLabels();
    refreshDrillDown();
    emit selectionChanged();
}

void PromptPage::clearSelection()
{
    m_layer = -1;
    m_heatmap->setSelection(-1, 0);
    m_worstView->clearSelection();
    pinRowLabels();
    refreshDrillDown();
    emit selectionChanged();
}

void PromptPage::refreshDrillDown()
{
    const PromptAnalysis* p = prompt();
    if (!p || m_layer < 0) {
        m_drill->clear(tr("no cell selected: click the heatmap or a worst cell"));
        return;
    }
    if (!m_controller->layerReady(m_layer)) {
        m_drill->clear(m_controller->isRunning() ? tr("this layer is not analysed yet") : tr("this layer was not analysed"));
        return;
    }
    m_drill->showCell(m_controller->result(), m_settings.prompt, m_settings.map, m_layer, m_token);
}

void PromptPage::refreshSummary()
{
    const PromptAnalysis* p = prompt();
    if (!p)
        return;
    m_worstTitle->setText(p->threeWay ? tr("<b>Worst cells</b>, in noise floors (L-inf / floor)")
                                      : tr("<b>Worst cells</b>, in noise floors (L2 / the dtype's rounding)"));

    // Cells of unfinished layers are still being written: rank once the analysis is over.
    if (!m_controller->isRunning())
        m_worstModel->setCells(p, kvscope::worstCells(*p, 100, &m_controller->readyLayers()));
    {
        const QSignalBlocker block(m_suspects);
        m_suspects->clear();
        m_evidence->clear();
        m_suspectImpact->clear();
        m_heatmap->setHighlight({});
        // Suspects are written when the whole analysis is over (ThreadSanitizer caught this
        // list being read while the worker assigned it): not before.
        const std::vector<Suspect> none;
        const std::vector<Suspect>& suspects = m_controller->isRunning() ? none : p->suspects;
        // A row that says its impact is a line longer, and wider than the side: wrapped, and the
        // list a line taller (rows without one as they were).
        const bool impact = std::any_of(suspects.begin(), suspects.end(), [](const Suspect& s) { return bool(s.impact); });
        m_suspects->setWordWrap(impact);
        m_suspects->setHorizontalScrollBarPolicy(impact ? Qt::ScrollBarAlwaysOff : Qt::ScrollBarAsNeeded);
        m_suspects->setMaximumHeight(impact ? 80 + 2 * m_suspects->fontMetrics().lineSpacing() : 80);
        for (const Suspect& s : suspects) {
            // Two short lines, to fit the side panel: what and how far; where.
            const QString explanation = s.hypothesis.kind.empty() ? QString()
                                        : s.pattern == SuspectPattern::Unexplained
                                            ? QString(" (nearest %1)").arg(QString::fromStdString(s.hypothesis.kind))
                                            : QString(": %1").arg(QString::fromStdString(s.hypothesis.kind));
            // (a NaN or infinity has no number of floors: it says what it is)
            const QString size = s.pattern == SuspectPattern::NonFinite ? tr("NaN or infinity")
                                                                         : tr("%1 floors").arg(s.score, 0, 'g', 3);
            // The structure its off positions follow, with its statistic, at a glance; its
            // sentence in the tooltip and the evidence.
            const StructuralFinding* structure = structureOf(s, m_controller->result()->suspects, p->id);
            const double chance = structure ? structure->parameter("chance") : std::nan("");
            const QString structureText = !structure ? QString()
                                          : chance > 0 ? tr("\n%1, chance 1 in %2").arg(QString::fromStdString(structure->kind)).arg(std::lround(1 / chance))
                                                       : tr("\n%1").arg(QString::fromStdString(structure->kind));
            // What it does to the output, short; its sentence in the tooltip and under the evidence.
            const QString impactText = s.impact ? "\n" + QString::fromStdString(impactShortText(*s.impact)) : QString();
            auto* item = new QListWidgetItem(QString("%1%2, %3\n%4 · tokens %5-%6%7%8")
                                                 .arg(suspectPatternName(s.pattern),
                                                      s.pattern == SuspectPattern::NonFinite ? QString() : explanation, size)
                                                 .arg(QString::fromStdString(shortLayerName(s.firstLayer)))
                                                 .arg(s.firstToken)
                                                 .arg(s.lastToken)
                                                 .arg(structureText, impactText));
            QString tooltip = structure ? tr("<p><b>%1</b>: %2</p><p>%3</p>")
                                              .arg(QString::fromStdString(structure->kind),
                                                   QString::fromStdString(structure->text).toHtmlEscaped(),
                                                   evidenceWith(s, structure).toHtmlEscaped())
                                        : QString::fromStdString(s.evidence);
            if (s.impact)  // (a plain evidence tooltip becomes rich text: escaped with it)
                tooltip = (structure ? tooltip : "<p>" + tooltip.toHtmlEscaped() + "</p>") + "<p>" +
                          impactSentence(s).toHtmlEscaped() + "</p>";
            item->setToolTip(tooltip);
            m_suspects->addItem(item);
        }
        // What each layer's KV does to the output, beside the map (hidden without a record).
        m_impact->setImpacts(m_controller->isRunning() ? std::vector<LayerImpact>()
                                                       : layerImpacts(m_controller->result()->prompts, {p->id}, p->layers));
        // The top suspect's heads stay marked in the drill-down, whichever prompt is shown.
        markSuspectHeads(suspects.empty() ? nullptr : &suspects.front());
        if (suspects.empty())
            m_evidence->setText(m_controller->isRunning()                   ? tr("(after the analysis)")
                                : !m_controller->recorded().searchSuspects ? tr("Not looked for: this analysis was saved without its suspect search.")
                                                                           : tr("None: nothing leaves the noise floor of its dtype."));
    }
    // Problems are appended by the workers while they run: read them once the analysis is over.
    QStringList problems;
    for (const SweepBundle& b : m_controller->result()->bundles)  // a sweep's bundles left out
        if (!b.problem.empty())
            problems << tr("left out of the sweep: %1").arg(QString::fromStdString(b.problem).toHtmlEscaped());
    for (const std::string& s : m_controller->result()->problems)
        problems << QString::fromStdString(s).toHtmlEscaped();
    if (!m_controller->isRunning()) {
        for (const std::string& s : p->problems)
            problems << QString::fromStdString(s).toHtmlEscaped();
        if (!p->nonFinite.empty())
            problems << tr("%1 cell(s) hold NaN or infinity in their input").arg(p->nonFinite.size());
    }
    m_problems->setText(problems.isEmpty() ? QString() : tr("<b>Could not analyse everything:</b><br>") + problems.join("<br>"));
    QStringList replicas;
    if (!m_controller->isRunning())
        for (const ReplicaDifference& d : p->replicaDifferences)
            replicas << QString::fromStdString(d.describe()).toHtmlEscaped();
    m_replicas->setText(replicas.isEmpty() ? QString() : tr("<b>Replicas differ:</b> ") + replicas.join("<br>"));
    QStringList notCompared;
    for (const std::string& line : describeNotCompared(m_controller->result()->notCompared))
        notCompared << QString::fromStdString(line).toHtmlEscaped();
    m_notCompared->setText(notCompared.isEmpty() ? QString() : tr("<b>Not compared:</b> ") + notCompared.join("<br>"));
}

QString PromptPage::cellTooltip(int row, qint64 token) const
{
    const PromptAnalysis* p = prompt();
    if (!p || row < 0 || row >= int(p->layers.size()) || token < 0 || token >= p->tokens)
        return {};
    const PromptInfo& info = m_controller->loader()->prompt(p->id);
    // (the layer as its row names it)
    const std::string layer = layerRowLabel(m_controller->loader()->config(), p->layers[std::size_t(row)]);
    QString text = QString("<b>%1</b><br>token %2").arg(QString::fromStdString(layer).toHtmlEscaped()).arg(token);
    if (std::size_t(token) < info.tokenStrings.size())
        text += QString(" '%1'").arg(QString::fromStdString(info.tokenStrings[std::size_t(token)]).toHtmlEscaped());
    text += token < p->promptLen ? tr(" (prefill)") : tr(" (decode)");
    if (const ProvenanceRange* source = provenanceAt(p->provenance, token))
        text += tr("<br>KV from: %1").arg(QString::fromStdString(sourceOf(*source)).toHtmlEscaped());
    for (const Divergence& d : p->divergences)
        if (d.position == token) {
            text += tr("<br><b>divergence</b>");
            if (d.logitGap && d.ulpBound)
                text += tr(": logit gap %1, %2 the bf16 bound %3")
                            .arg(*d.logitGap, 0, 'g', 4)
                            .arg(d.inBounds.value_or(false) ? tr("within") : tr("beyond"))
                            .arg(*d.ulpBound, 0, 'g', 4);
            else
                text += tr(" (recorded; no logits to bound it)");
        }
    if (!m_controller->layerReady(row))
        return text + (m_controller->isRunning() ? tr("<br>not analysed yet") : tr("<br>not analysed"));
    const HeatmapSpec& s = m_settings.map;
    int head = -1;
    const float value = heatmapValue(*p, s, row, token, &head);
    text += QString("<br>%1: <b>%2</b>").arg(QString::fromStdString(mapMetricLabel(s, *p)),
                                             std::isnan(value) ? tr("no data") : QString::number(value, 'g', 4));
    if (const float noise = heatmapBaseValue(*p, s, row, token); !std::isnan(noise))
        text += tr("<br>dtype noise here (expected vs baseline): %1").arg(noise, 0, 'g', 4);
    if (std::size_t(row) < m_offThresholds.size() && std::isfinite(value))  // what the colour says
        text += tr("<br>off above %1 floors here (noise reaches it in one capture of a hundred): %2")
                    .arg(m_offThresholds[std::size_t(row)], 0, 'g', 3)
                    .arg(value > m_offThresholds[std::size_t(row)] ? tr("<b>off</b>")
                         : value > kNoiseShareOfOff * m_offThresholds[std::size_t(row)] ? tr("above noise, not off")
                                                                                         : tr("noise"));
    if (head >= 0) {  // in the statistic the worst-cells list gives (worst_cells.h)
        const Metric m = metricFor(s.part, p->threeWay ? MetricKind::Linf : MetricKind::L2);
        const float error = p->value(m, row, token, head);
        const double floor = p->threeWay ? double(noiseFloor(*p, m, row, token)) : cellFloor(*p, s.part, row, token);
        text += tr("<br>head %1: %2 %3, ratio %4 (noise floor %5)")
                    .arg(head)
                    .arg(p->threeWay ? tr("L-inf") : tr("L2"))
                    .arg(error, 0, 'g', 4)
                    .arg(p->threeWay ? double(headErrorRatio(*p, m, row, token, head)) : double(error) / floor, 0, 'g', 4)
                    .arg(floor, 0, 'g', 4);
    }
    if (!p->suspects.empty() && p->suspects.front().firstLayer == p->layers[std::size_t(row)])
        text += tr("<br><b>the suspect starts here</b> (framed)");
    if (m_heatmap->isSpreadRow(row))
        text += tr("<br><i>%1: the suspect starts there; this layer's error follows from it</i>").arg(m_heatmap->spreadLabel());
    if (p->threeWay)  // not the reference tool's BC, which the histogram shows for one head
        text += tr("<br>BC vs noise floor: K %1, V %2")
                    .arg(p->bcVsNoiseValue(KvPart::K, row, token), 0, 'g', 4)
                    .arg(p->bcVsNoiseValue(KvPart::V, row, token), 0, 'g', 4);
    return text;
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

void PromptPage::showContextMenu(const QPoint& globalPos)
{
    QMenu menu;
    menu.addAction(tr("Reset zoom\tHome"), m_heatmap, &HeatmapView::resetZoom);
    QAction* clearSelection = menu.addAction(tr("Clear selection\tEsc"), this, &PromptPage::clearSelection);
    clearSelection->setEnabled(m_layer >= 0);
    menu.exec(globalPos);
}

}  // namespace kvscope
