#include "gui/main_window.h"

#include "widgets/bc_bar_view.h"
#include "metrics/error_histogram.h"
#include "gui/head_table_model.h"
#include "widgets/heatmap_view.h"
#include "widgets/histogram_view.h"
#include "report/report_writer.h"
#include "widgets/token_line_view.h"
#include "gui/worst_cells_model.h"

#include <QApplication>
#include <QCheckBox>
#include <QComboBox>
#include <QDoubleSpinBox>
#include <QDragEnterEvent>
#include <QFileDialog>
#include <QFileInfo>
#include <QHeaderView>
#include <QLabel>
#include <QMenuBar>
#include <QMessageBox>
#include <QMimeData>
#include <QProgressBar>
#include <QPushButton>
#include <QSettings>
#include <QSortFilterProxyModel>
#include <QSpinBox>
#include <QSplitter>
#include <QStatusBar>
#include <QSvgGenerator>
#include <QTabWidget>
#include <QTableView>
#include <QTimer>
#include <QToolBar>
#include <QToolTip>
#include <QVBoxLayout>
#include <QtConcurrent>

#include <cmath>

namespace kvscope {

namespace {

ScaleKind scaleOf(HeatmapMetric metric)
{
    return metric == HeatmapMetric::Bc ? ScaleKind::Bc : metric == HeatmapMetric::ErrorRatio ? ScaleKind::Ratio : ScaleKind::Error;
}

QString shortLayer(const std::string& name)
{
    return QString::fromStdString(name).remove(QStringLiteral(".self_attn"));
}

}  // namespace

MainWindow::MainWindow(QWidget* parent)
    : QMainWindow(parent)
    , m_controller(new AnalysisController(this))
{
    setWindowTitle("kvscope");
    setAcceptDrops(true);
    buildUi();
    buildMenus();
    connect(m_controller, &AnalysisController::opened, this, &MainWindow::onOpened);
    connect(m_controller, &AnalysisController::progress, this, &MainWindow::onProgress);
    connect(m_controller, &AnalysisController::layerFinished, this, [this] { refreshHeatmap(); });
    connect(m_controller, &AnalysisController::finished, this, &MainWindow::onFinished);
    connect(m_controller, &AnalysisController::failed, this, &MainWindow::onFailed);
    connect(m_controller, &AnalysisController::cancelled, this, [this] {
        m_progress->hide();
        m_cancel->hide();
        m_status->setText(tr("analysis cancelled: the layers done so far are shown"));
    });
    resize(1500, 950);
}

MainWindow::~MainWindow() = default;

void MainWindow::buildUi()
{
    auto* bar = addToolBar(tr("View"));
    bar->setObjectName("view");
    m_promptBox = new QComboBox;
    m_promptBox->setSizeAdjustPolicy(QComboBox::AdjustToContents);
    m_partBox = new QComboBox;
    m_partBox->addItems({"K", "V"});
    m_metricBox = new QComboBox;
    m_metricBox->addItem(tr("relative L-inf"), int(HeatmapMetric::RelLinf));
    m_metricBox->addItem(tr("relative L2"), int(HeatmapMetric::RelL2));
    m_metricBox->addItem(tr("1 - cosine"), int(HeatmapMetric::OneMinusCos));
    m_metricBox->addItem(tr("error ratio (3-way)"), int(HeatmapMetric::ErrorRatio));
    m_metricBox->addItem(tr("BC (3-way)"), int(HeatmapMetric::Bc));
    m_reductionBox = new QComboBox;
    m_reductionBox->addItems({tr("max over heads"), tr("mean over heads"), tr("one head")});
    m_headBox = new QSpinBox;
    m_headBox->setPrefix(tr("head "));
    m_headBox->setEnabled(false);
    m_minBox = new QDoubleSpinBox;
    m_maxBox = new QDoubleSpinBox;
    for (QDoubleSpinBox* box : {m_minBox, m_maxBox}) {
        box->setDecimals(5);
        box->setRange(0, 1e9);
        box->setSingleStep(0.01);
        box->setKeyboardTracking(false);
    }
    m_logBox = new QCheckBox(tr("log"));
    auto* defaults = new QPushButton(tr("default range"));
    bar->addWidget(new QLabel(tr(" prompt ")));
    bar->addWidget(m_promptBox);
    bar->addWidget(m_partBox);
    bar->addWidget(m_metricBox);
    bar->addWidget(m_reductionBox);
    bar->addWidget(m_headBox);
    bar->addSeparator();
    bar->addWidget(new QLabel(tr(" colour ")));
    bar->addWidget(m_minBox);
    bar->addWidget(new QLabel(" .. "));
    bar->addWidget(m_maxBox);
    bar->addWidget(m_logBox);
    bar->addWidget(defaults);

    // Per prompt: the heatmap over the drill-down; the summary at the side.
    m_heatmap = new HeatmapView;
    m_headModel = new HeadTableModel(this);
    m_headProxy = new QSortFilterProxyModel(this);
    m_headProxy->setSourceModel(m_headModel);
    m_headProxy->setSortRole(Qt::UserRole);
    m_headView = new QTableView;
    m_headView->setModel(m_headProxy);
    m_headView->setSortingEnabled(true);
    m_headView->verticalHeader()->hide();
    m_headView->horizontalHeader()->setSectionResizeMode(QHeaderView::ResizeToContents);
    m_histogram = new HistogramView;
    m_logCounts = new QCheckBox(tr("log counts"));
    m_wholeSequence = new QCheckBox(tr("all tokens of the layer"));
    m_line = new TokenLineView;
    auto* histogramBox = new QWidget;
    auto* histogramLayout = new QVBoxLayout(histogramBox);
    histogramLayout->setContentsMargins(0, 0, 0, 0);
    auto* histogramOptions = new QHBoxLayout;
    histogramOptions->addWidget(m_logCounts);
    histogramOptions->addWidget(m_wholeSequence);
    histogramOptions->addStretch();
    histogramLayout->addLayout(histogramOptions);
    histogramLayout->addWidget(m_histogram);
    auto* drill = new QSplitter(Qt::Horizontal);
    drill->addWidget(m_headView);
    drill->addWidget(histogramBox);
    drill->addWidget(m_line);
    drill->setStretchFactor(0, 3);
    drill->setStretchFactor(1, 2);
    drill->setStretchFactor(2, 2);

    m_worstModel = new WorstCellsModel(this);
    m_worstView = new QTableView;
    m_worstView->setModel(m_worstModel);
    m_worstView->verticalHeader()->hide();
    m_worstView->setSelectionBehavior(QAbstractItemView::SelectRows);
    m_worstView->horizontalHeader()->setSectionResizeMode(QHeaderView::ResizeToContents);
    m_issues = new QLabel;
    m_issues->setWordWrap(true);
    m_issues->setStyleSheet("color: #a00;");
    auto* side = new QWidget;
    auto* sideLayout = new QVBoxLayout(side);
    sideLayout->setContentsMargins(0, 0, 0, 0);
    sideLayout->addWidget(new QLabel(tr("<b>Worst cells</b> (three-way: by error ratio)")));
    sideLayout->addWidget(m_worstView);
    sideLayout->addWidget(m_issues);

    auto* vertical = new QSplitter(Qt::Vertical);
    vertical->addWidget(m_heatmap);
    vertical->addWidget(drill);
    vertical->setStretchFactor(0, 3);
    vertical->setStretchFactor(1, 2);
    vertical->setSizes({560, 330});
    auto* perPrompt = new QSplitter(Qt::Horizontal);
    perPrompt->addWidget(vertical);
    perPrompt->addWidget(side);
    perPrompt->setStretchFactor(0, 4);
    perPrompt->setStretchFactor(1, 1);

    // Across prompts: BC by generation index x layer, and combined BC per layer.
    m_aggregate = new HeatmapView;
    m_aggregate->setScale(ScaleKind::Bc, defaultRange(ScaleKind::Bc), false);
    m_aggregate->xAxis->setLabel(tr("generation index (0 = first decode token)"));
    m_bcBars = new BcBarView;
    auto* across = new QSplitter(Qt::Vertical);
    across->addWidget(m_aggregate);
    across->addWidget(m_bcBars);
    across->setStretchFactor(0, 3);
    across->setStretchFactor(1, 1);

    m_tabs = new QTabWidget;
    m_tabs->addTab(perPrompt, tr("Per prompt"));
    m_tabs->addTab(across, tr("Across prompts"));
    setCentralWidget(m_tabs);

    m_status = new QLabel(tr("Open a capture bundle (File > Open, or drop it here)"));
    m_progress = new QProgressBar;
    m_progress->setMaximumWidth(240);
    m_cancel = new QPushButton(tr("Cancel"));
    statusBar()->addWidget(m_status, 1);
    statusBar()->addPermanentWidget(m_progress);
    statusBar()->addPermanentWidget(m_cancel);
    m_progress->hide();
    m_cancel->hide();

    m_poolTimer = new QTimer(this);
    m_poolTimer->setSingleShot(true);
    m_poolTimer->setInterval(40);  // coalesce zoom and pan into one re-pooling
    m_histogramWatcher = new QFutureWatcher<std::shared_ptr<HeadErrorHistogram>>(this);

    connect(m_cancel, &QPushButton::clicked, m_controller, &AnalysisController::cancel);
    connect(m_promptBox, qOverload<int>(&QComboBox::currentIndexChanged), this, [this] {
        m_selLayer = -1;
        m_heatmap->setSelection(-1, 0);
        if (const PromptAnalysis* p = prompt())
            m_heatmap->resetView(p->tokens, int(p->layers.size()));
        refreshHeatmap();
        refreshSummary();
        refreshDrillDown();
    });
    for (QComboBox* box : {m_partBox, m_reductionBox})
        connect(box, qOverload<int>(&QComboBox::currentIndexChanged), this, [this] {
            m_headBox->setEnabled(m_reductionBox->currentIndex() == 2);
            refreshHeatmap();
            refreshDrillDown();
            if (!m_controller->isRunning())
                refreshAggregate();
        });
    connect(m_aggregate, &HeatmapView::cellHovered, this, [this](int row, qint64 g, const QPoint& globalPos) {
        const auto result = m_controller->result();
        if (!result || !result->aggregate || m_controller->isRunning())
            return;
        const AggregateBc& a = *result->aggregate;
        if (row < 0 || row >= int(a.layers.size()) || g < 0 || g >= a.generationCount)
            return;
        const float bc = a.bc[std::size_t(spec().part)][std::size_t(row) * std::size_t(a.generationCount) + std::size_t(g)];
        QToolTip::showText(globalPos,
                           QString("<b>%1</b><br>generation index %2<br>%3 BC: %4<br>divergences here: %5/%6")
                               .arg(QString::fromStdString(a.layers[std::size_t(row)]))
                               .arg(g)
                               .arg(m_partBox->currentText(), std::isnan(bc) ? tr("no data") : QString::number(bc, 'f', 4))
                               .arg(a.divergenceCounts[std::size_t(g)])
                               .arg(a.promptIds.size()),
                           m_aggregate);
    });
    connect(m_metricBox, qOverload<int>(&QComboBox::currentIndexChanged), this, [this] {
        const QCPRange r = defaultRange(scaleOf(spec().metric));
        const QSignalBlocker b1(m_minBox), b2(m_maxBox);
        m_minBox->setValue(r.lower);
        m_maxBox->setValue(r.upper);
        refreshScale();
        refreshHeatmap();
        refreshDrillDown();
    });
    connect(m_headBox, qOverload<int>(&QSpinBox::valueChanged), this, [this] { refreshHeatmap(); });
    for (QDoubleSpinBox* box : {m_minBox, m_maxBox})
        connect(box, qOverload<double>(&QDoubleSpinBox::valueChanged), this, &MainWindow::refreshScale);
    connect(m_logBox, &QCheckBox::toggled, this, &MainWindow::refreshScale);
    connect(defaults, &QPushButton::clicked, this, [this] {
        const QCPRange r = defaultRange(scaleOf(spec().metric));
        m_minBox->setValue(r.lower);
        m_maxBox->setValue(r.upper);
        m_logBox->setChecked(false);
    });
    connect(m_heatmap, &HeatmapView::cellClicked, this, [this](int row, qint64 token) { selectCell(row, token); });
    connect(m_heatmap, &HeatmapView::cellHovered, this, &MainWindow::showTooltip);
    connect(m_heatmap, &HeatmapView::visibleTokensChanged, m_poolTimer, qOverload<>(&QTimer::start));
    connect(m_poolTimer, &QTimer::timeout, this, &MainWindow::refreshPooling);
    connect(m_worstView, &QTableView::clicked, this, [this](const QModelIndex& index) {
        const WorstCell& c = m_worstModel->cell(index.row());
        setPart(c.part);
        selectCell(c.layer, c.token);
    });
    connect(m_logCounts, &QCheckBox::toggled, m_histogram, &HistogramView::setLogCounts);
    connect(m_wholeSequence, &QCheckBox::toggled, this, &MainWindow::requestHistogram);
    connect(m_histogramWatcher, &QFutureWatcherBase::finished, this, [this] {
        if (m_histogramWatcher->future().resultCount() == 0)
            return;  // dropped (a new bundle was opened)
        const auto h = m_histogramWatcher->result();
        if (h)
            m_histogram->setHistogram(*h, m_histogramTitle);
        else
            m_histogram->clearHistogram(tr("no histogram: the data could not be read"));
        emit histogramShown();
    });
    const QCPRange r = defaultRange(ScaleKind::Error);
    m_minBox->setValue(r.lower);
    m_maxBox->setValue(r.upper);
}

void MainWindow::buildMenus()
{
    QMenu* file = menuBar()->addMenu(tr("&File"));
    file->addAction(tr("&Open bundle..."), QKeySequence::Open, this, [this] {
        const QString path = QFileDialog::getOpenFileName(this, tr("Open capture bundle"), {},
                                                          tr("Capture bundles (*.h5 *.hdf5);;All files (*)"));
        if (!path.isEmpty())
            openPath(path);
    });
    file->addAction(tr("Open &folder of dumps..."), this, [this] {
        const QString dir = QFileDialog::getExistingDirectory(this, tr("Open a folder of .pt / .safetensors dumps"));
        if (!dir.isEmpty())
            openPath(dir);
    });
    m_recentMenu = file->addMenu(tr("Open &recent"));
    rebuildRecentMenu();
    file->addSeparator();
    QMenu* exportMenu = file->addMenu(tr("&Export view"));
    for (const QString& format : {QStringLiteral("PNG"), QStringLiteral("PDF"), QStringLiteral("SVG")})
        exportMenu->addAction(format + "...", this, [this, format] {
            const QString path = QFileDialog::getSaveFileName(this, tr("Export view"), "kvscope-view." + format.toLower(),
                                                              format + " (*." + format.toLower() + ")");
            if (!path.isEmpty() && !exportView(path))
                QMessageBox::warning(this, tr("Export"), tr("Could not write %1").arg(path));
        });
    exportMenu->addAction(tr("HTML report..."), this, [this] {
        const auto result = m_controller->result();
        if (!result || m_controller->isRunning()) {
            QMessageBox::information(this, tr("Report"), tr("Wait for the analysis to finish."));
            return;
        }
        const QString dir = QFileDialog::getExistingDirectory(this, tr("Write the report into"));
        if (dir.isEmpty())
            return;
        // The PNG images are drawn by the heatmap widget, which lives on this thread.
        QApplication::setOverrideCursor(Qt::WaitCursor);
        try {
            const ReportFiles files = writeReport(*m_controller->reader(), *result, Thresholds{}, dir);
            QApplication::restoreOverrideCursor();
            m_status->setText(tr("wrote %1").arg(files.html));
        } catch (const std::exception& e) {
            QApplication::restoreOverrideCursor();
            QMessageBox::warning(this, tr("Report"), QString::fromStdString(e.what()));
        }
    });
    file->addSeparator();
    file->addAction(tr("&Quit"), QKeySequence::Quit, qApp, &QApplication::quit);
}

void MainWindow::openPath(const QString& path)
{
    m_status->setText(tr("opening %1").arg(path));
    m_progress->setRange(0, 0);
    m_progress->show();
    m_cancel->show();
    m_selLayer = -1;
    m_headModel->clear();
    m_worstModel->setCells(nullptr, {});
    m_histogramWatcher->setFuture(QFuture<std::shared_ptr<HeadErrorHistogram>>());  // drop an old bundle's histogram
    m_histogram->clearHistogram(QString());
    addRecent(path);
    m_controller->open(path);
}

const PromptAnalysis* MainWindow::prompt() const
{
    const auto result = m_controller->result();
    const int index = m_promptBox->currentIndex();
    if (!result || index < 0 || index >= int(result->prompts.size()))
        return nullptr;
    return &result->prompts[std::size_t(index)];
}

HeatmapSpec MainWindow::spec() const
{
    HeatmapSpec s;
    s.metric = HeatmapMetric(m_metricBox->currentData().toInt());
    s.part = m_partBox->currentIndex() == 0 ? KvPart::K : KvPart::V;
    s.reduction = HeadReductionKind(m_reductionBox->currentIndex());
    s.head = m_headBox->value();
    return s;
}

void MainWindow::onOpened()
{
    const auto result = m_controller->result();
    setWindowTitle("kvscope - " + QFileInfo(m_controller->path()).fileName());
    {
        const QSignalBlocker blocker(m_promptBox);
        m_promptBox->clear();
        for (const PromptAnalysis& p : result->prompts)
            m_promptBox->addItem(QString("%1 (%2, %3 tokens)")
                                     .arg(QString::fromStdString(p.id), p.threeWay ? "3-way" : "2-way")
                                     .arg(p.tokens));
    }
    if (!result->prompts.empty()) {
        m_headBox->setRange(0, result->prompts.front().heads - 1);
        // Three-way captures open on the error ratio: dtype noise is ~1, bugs stand out.
        const bool threeWay = result->prompts.front().threeWay;
        m_metricBox->setCurrentIndex(threeWay ? 3 : 0);
    }
    refreshScale();
    refreshHeatmap();
    if (const PromptAnalysis* p = prompt())
        m_heatmap->resetView(p->tokens, int(p->layers.size()));
    refreshSummary();
}

void MainWindow::onProgress(int done, int total, const QString& what)
{
    m_progress->setRange(0, total);
    m_progress->setValue(done);
    m_status->setText(total ? tr("%1: %2 of %3 layers").arg(what).arg(done).arg(total) : what);
}

void MainWindow::onFinished()
{
    m_progress->hide();
    m_cancel->hide();
    const auto result = m_controller->result();
    m_status->setText(tr("%1: %2 prompt(s), %3 layers analysed")
                          .arg(QFileInfo(m_controller->path()).fileName())
                          .arg(result->prompts.size())
                          .arg(result->prompts.empty() ? 0 : result->prompts.front().layers.size()));
    refreshHeatmap();
    refreshSummary();
    refreshAggregate();
    if (m_selLayer < 0) {
        // Start where it is worst.
        if (m_worstModel->rowCount() > 0) {
            const WorstCell& c = m_worstModel->cell(0);
            setPart(c.part);
            selectCell(c.layer, c.token);
        }
    } else {
        refreshDrillDown();
    }
}

void MainWindow::onFailed(const QString& message)
{
    m_progress->hide();
    m_cancel->hide();
    m_status->setText(tr("could not open: %1").arg(message));
    auto* box = new QMessageBox(QMessageBox::Critical, tr("kvscope"), tr("This capture cannot be analysed."),
                                QMessageBox::Ok, this);
    box->setInformativeText(message);
    box->setAttribute(Qt::WA_DeleteOnClose);
    box->open();
}

void MainWindow::refreshHeatmap()
{
    const PromptAnalysis* p = prompt();
    if (!p)
        return;
    const HeatmapSpec s = spec();
    m_fullGrid = buildHeatmap(*p, s, &m_controller->readyLayers());
    QStringList rows, tokens;
    for (std::size_t l = 0; l < p->layers.size(); ++l) {
        const int g = p->layerGroups[l];
        const KvCacheGroup& group = m_controller->reader()->config().groups[std::size_t(g)];
        rows << QString("%1 [%2]").arg(shortLayer(p->layers[l]), group.slidingWindow && group.specType == SpecType::SlidingWindow
                                                                     ? QString("sliding %1").arg(*group.slidingWindow)
                                                                 : group.slidingWindow ? QString("full, window %1").arg(*group.slidingWindow)
                                                                                       : QStringLiteral("full"));
    }
    const PromptInfo& info = m_controller->reader()->prompt(p->id);
    for (const std::string& t : info.tokenStrings)
        tokens << QString::fromStdString(t);
    m_heatmap->setRowLabels(rows);
    m_heatmap->setTokenLabels(tokens);
    QVector<double> divergences;
    for (const Divergence& d : p->divergences)
        divergences << double(d.position);
    m_heatmap->setMarkers(double(p->promptLen) - 0.5, divergences);
    m_heatmap->setTitle(QString("%1 - %2 %3, %4")
                            .arg(QString::fromStdString(p->id), m_partBox->currentText(),
                                 QString::fromStdString(heatmapMetricName(s.metric)), m_reductionBox->currentText()));
    refreshPooling();
}

void MainWindow::refreshPooling()
{
    if (m_fullGrid.rows == 0)
        return;
    // Downsample for display: the worst value of each run of tokens that shares a pixel column.
    const QCPRange r = m_heatmap->xAxis->range();
    const qint64 from = std::max<qint64>(0, qint64(std::floor(r.lower)));
    const qint64 to = std::min<qint64>(m_fullGrid.columns, qint64(std::ceil(r.upper)) + 1);
    const qint64 pixels = std::max(100, m_heatmap->axisRect()->width());
    m_heatmap->setGrid(poolColumns(m_fullGrid, from, std::max(to, from + 1), pixels, lowerIsWorse(spec().metric)));
}

void MainWindow::refreshScale()
{
    const ScaleKind kind = scaleOf(spec().metric);
    m_heatmap->setScale(kind, QCPRange(m_minBox->value(), std::max(m_maxBox->value(), m_minBox->value() + 1e-9)),
                        m_logBox->isChecked());
}

void MainWindow::selectCell(int layer, qint64 token)
{
    const PromptAnalysis* p = prompt();
    if (!p || layer < 0 || layer >= int(p->layers.size()) || token < 0 || token >= p->tokens)
        return;
    m_selLayer = layer;
    m_selToken = token;
    m_heatmap->setSelection(layer, token);
    refreshDrillDown();
}

void MainWindow::refreshDrillDown()
{
    const PromptAnalysis* p = prompt();
    if (!p || m_selLayer < 0 || !m_controller->layerReady(m_selLayer)) {
        m_headModel->clear();
        return;
    }
    m_headModel->setCell(m_controller->result(), m_promptBox->currentIndex(), m_selLayer, m_selToken);
    const HeatmapSpec s = spec();
    int head = -1;
    heatmapValue(*p, s, m_selLayer, m_selToken, &head);
    if (head < 0)
        head = s.reduction == HeadReductionKind::OneHead ? s.head : 0;
    // The per-token line: the chosen metric of this layer and head across the sequence.
    const Metric metric = s.metric == HeatmapMetric::RelL2 ? metricFor(s.part, 2)
                        : s.metric == HeatmapMetric::OneMinusCos ? metricFor(s.part, 0) : metricFor(s.part, 1);
    QVector<double> target, base;
    for (qint64 t = 0; t < p->tokens; ++t) {
        const double v = p->value(metric, m_selLayer, t, head), b = p->value(baseOf(metric), m_selLayer, t, head);
        target << (metric == metricFor(s.part, 0) ? 1.0 - v : v);
        if (p->threeWay)
            base << (metric == metricFor(s.part, 0) ? 1.0 - b : b);
    }
    QVector<double> divergences;
    for (const Divergence& d : p->divergences)
        divergences << double(d.position);
    m_line->setSeries(target, base,
                      QString("%1, head %2").arg(shortLayer(p->layers[std::size_t(m_selLayer)])).arg(head),
                      QString("%1 %2").arg(m_partBox->currentText(), metric == metricFor(s.part, 0) ? "1 - cos"
                                                                   : metric == metricFor(s.part, 2) ? "rel. L2" : "rel. L-inf"),
                      double(p->promptLen) - 0.5, divergences, m_selToken);
    m_headView->selectRow(m_headProxy->mapFromSource(m_headModel->index(head, 0)).row());
    requestHistogram();
}

void MainWindow::requestHistogram()
{
    const PromptAnalysis* p = prompt();
    if (!p || m_selLayer < 0 || !m_controller->reader() || !m_controller->layerReady(m_selLayer))
        return;
    const HeatmapSpec s = spec();
    int head = -1;
    heatmapValue(*p, s, m_selLayer, m_selToken, &head);
    head = std::max(head, 0);
    const bool whole = m_wholeSequence->isChecked();
    const qint64 begin = whole ? 0 : m_selToken, end = whole ? p->tokens : m_selToken + 1;
    m_histogramTitle = QString("%1 head %2 %3, %4")
                           .arg(shortLayer(p->layers[std::size_t(m_selLayer)]))
                           .arg(head)
                           .arg(m_partBox->currentText(), whole ? tr("all tokens") : tr("token %1").arg(m_selToken));
    // Reading the bundle is work: off the GUI thread.
    auto reader = m_controller->reader();
    const std::string id = p->id, layer = p->layers[std::size_t(m_selLayer)];
    const KvPart part = s.part;
    m_histogramWatcher->setFuture(QtConcurrent::run([reader, id, layer, head, part, begin, end] {
        try {
            const CaptureLoader loader(reader, UnreadableBlockPolicy::MarkAbsent);
            return std::make_shared<HeadErrorHistogram>(headErrorHistogram(loader, id, layer, head, part, begin, end));
        } catch (const std::exception&) {
            return std::shared_ptr<HeadErrorHistogram>();
        }
    }));
}

void MainWindow::refreshSummary()
{
    const PromptAnalysis* p = prompt();
    if (!p)
        return;
    if (!m_controller->isRunning())
        m_worstModel->setCells(p, kvscope::worstCells(*p, 100));
    // Issues are appended by the workers while they run: read them once the analysis is over.
    QStringList problems;
    for (const std::string& s : m_controller->result()->problems)
        problems << QString::fromStdString(s);
    if (!m_controller->isRunning()) {
        for (const std::string& s : p->issues)
            problems << QString::fromStdString(s);
        if (!p->nonFinite.empty())
            problems << tr("%1 cell(s) hold NaN or infinity in their input").arg(p->nonFinite.size());
    }
    m_issues->setText(problems.isEmpty() ? QString() : tr("<b>Could not analyse everything:</b><br>") + problems.join("<br>"));
}

void MainWindow::refreshAggregate()
{
    const auto result = m_controller->result();
    if (!result || !result->aggregate) {
        m_tabs->setTabEnabled(1, false);
        return;
    }
    m_tabs->setTabEnabled(1, true);
    const AggregateBc& a = *result->aggregate;
    const KvPart part = spec().part;
    m_aggregate->setGrid(kvscope::aggregateHeatmap(a, part));
    QStringList rows;
    for (const std::string& l : a.layers)
        rows << shortLayer(l);
    m_aggregate->setRowLabels(rows);
    m_aggregate->setMarkers(std::nan(""), {});
    m_aggregate->setTitle(tr("%1 BC by generation index across %2 prompt(s) (top: divergences c/N)")
                              .arg(m_partBox->currentText())
                              .arg(a.promptIds.size()));
    QVector<double> positions;
    QStringList counts;
    for (std::int64_t g = 0; g < a.generationCount; ++g)
        if (a.divergenceCounts[std::size_t(g)] > 0) {
            positions << double(g);
            counts << QString("%1/%2").arg(a.divergenceCounts[std::size_t(g)]).arg(a.promptIds.size());
        }
    m_aggregate->setTopLabels(positions, counts);
    m_aggregate->resetView(a.generationCount, int(a.layers.size()));
    QVector<double> k(a.combined[0].begin(), a.combined[0].end()), v(a.combined[1].begin(), a.combined[1].end());
    m_bcBars->setValues(rows, k, v);
}

void MainWindow::showTooltip(int row, qint64 token, const QPoint& globalPos)
{
    const PromptAnalysis* p = prompt();
    if (!p || !m_controller->layerReady(row))
        return;
    const HeatmapSpec s = spec();
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
        const Metric m = metricFor(s.part, 1);
        text += tr("<br>worst head %1: target L-inf %2").arg(head).arg(p->value(m, row, token, head), 0, 'g', 4);
        if (p->threeWay)
            text += tr(", base %1").arg(p->value(baseOf(m), row, token, head), 0, 'g', 4);
    }
    if (p->threeWay)
        text += QString("<br>BC K %1, V %2").arg(p->bcValue(KvPart::K, row, token), 0, 'g', 4).arg(p->bcValue(KvPart::V, row, token), 0, 'g', 4);
    QToolTip::showText(globalPos, text, m_heatmap);
}

bool MainWindow::exportView(const QString& path)
{
    QCustomPlot* plot = m_tabs->currentIndex() == 1 ? static_cast<QCustomPlot*>(m_aggregate) : m_heatmap;
    const QString suffix = QFileInfo(path).suffix().toLower();
    plot->replot(QCustomPlot::rpImmediateRefresh);
    if (suffix == "png")
        return plot->savePng(path, plot->width(), plot->height(), 2.0);
    if (suffix == "pdf")
        return plot->savePdf(path, plot->width(), plot->height());
    if (suffix == "svg") {
        QSvgGenerator svg;
        svg.setFileName(path);
        svg.setSize(plot->size());
        svg.setViewBox(QRect(QPoint(0, 0), plot->size()));
        svg.setTitle("kvscope view");
        QCPPainter painter;
        if (!painter.begin(&svg))
            return false;
        plot->toPainter(&painter, plot->width(), plot->height());
        return painter.end();
    }
    return false;
}

void MainWindow::showAcrossPrompts(bool across)
{
    m_tabs->setCurrentIndex(across ? 1 : 0);
}

void MainWindow::setPrompt(int index)
{
    m_promptBox->setCurrentIndex(index);
}

void MainWindow::setMetric(HeatmapMetric metric)
{
    m_metricBox->setCurrentIndex(m_metricBox->findData(int(metric)));
}

void MainWindow::setPart(KvPart part)
{
    m_partBox->setCurrentIndex(part == KvPart::K ? 0 : 1);
}

void MainWindow::keyPressEvent(QKeyEvent* event)
{
    if (m_selLayer >= 0) {
        switch (event->key()) {
        case Qt::Key_Left:
            return selectCell(m_selLayer, m_selToken - 1);
        case Qt::Key_Right:
            return selectCell(m_selLayer, m_selToken + 1);
        case Qt::Key_Up:
            return selectCell(m_selLayer - 1, m_selToken);
        case Qt::Key_Down:
            return selectCell(m_selLayer + 1, m_selToken);
        default:
            break;
        }
    }
    QMainWindow::keyPressEvent(event);
}

void MainWindow::dragEnterEvent(QDragEnterEvent* event)
{
    if (event->mimeData()->hasUrls())
        event->acceptProposedAction();
}

void MainWindow::dropEvent(QDropEvent* event)
{
    const QList<QUrl> urls = event->mimeData()->urls();
    if (!urls.isEmpty() && urls.first().isLocalFile())
        openPath(urls.first().toLocalFile());
}

void MainWindow::addRecent(const QString& path)
{
    QSettings settings;
    QStringList recent = settings.value("recentFiles").toStringList();
    recent.removeAll(path);
    recent.prepend(path);
    while (recent.size() > 10)
        recent.removeLast();
    settings.setValue("recentFiles", recent);
    rebuildRecentMenu();
}

void MainWindow::rebuildRecentMenu()
{
    m_recentMenu->clear();
    const QStringList recent = QSettings().value("recentFiles").toStringList();
    for (const QString& path : recent)
        m_recentMenu->addAction(path, this, [this, path] { openPath(path); });
    m_recentMenu->setEnabled(!recent.isEmpty());
}

}  // namespace kvscope
