#include "gui/main_window.h"

#include "analysis/worst_prompt.h"
#include "gui/across_prompts_page.h"
#include "gui/compare_page.h"
#include "gui/whatif_page.h"
#include "gui/drill_down_panel.h"
#include "gui/help_menu.h"
#include "report/report_writer.h"
#include "widgets/heatmap_view.h"
#include "widgets/plot_export.h"

#include <QApplication>
#include <QDragEnterEvent>
#include <QFileDialog>
#include <QFileInfo>
#include <QLabel>
#include <QMenuBar>
#include <QMessageBox>
#include <QMimeData>
#include <QProgressBar>
#include <QPushButton>
#include <QScreen>
#include <QSettings>
#include <QStatusBar>
#include <QTabWidget>

#include <utility>

namespace kvscope {

MainWindow::MainWindow(QWidget* parent)
    : QMainWindow(parent)
    , m_controller(new AnalysisController(this))
    , m_toolbar(new ViewToolbar(this))
    , m_promptPage(new PromptPage(m_controller))
    , m_acrossPage(new AcrossPromptsPage(m_controller))
    , m_whatIfPage(new WhatIfPage(m_controller))
    , m_comparePage(new ComparePage(m_controller))
    , m_tabs(new QTabWidget)
    , m_recent(new RecentFilesMenu(this))
    , m_status(new QLabel(tr("Open a capture bundle (File > Open, or drop it here)")))
    , m_progress(new QProgressBar)
    , m_cancel(new QPushButton(tr("Cancel")))
{
    setWindowTitle("kvscope");
    setAcceptDrops(true);
    addToolBar(m_toolbar);
    m_tabs->addTab(m_promptPage, tr("Per prompt"));
    m_tabs->addTab(m_acrossPage, tr("Across prompts"));
    m_tabs->addTab(m_whatIfPage, tr("What if"));
    m_tabs->addTab(m_comparePage, tr("Compare"));
    setCentralWidget(m_tabs);
    m_progress->setMaximumWidth(240);
    statusBar()->addWidget(m_status, 1);
    statusBar()->addPermanentWidget(m_progress);
    statusBar()->addPermanentWidget(m_cancel);
    m_progress->hide();
    m_cancel->hide();
    m_tabs->setTabEnabled(1, false);
    m_tabs->setTabEnabled(2, false);
    m_tabs->setTabEnabled(3, false);
    m_toolbar->setEnabled(false);  // nothing to view yet
    buildMenus();
    m_settings = m_toolbar->settings();
    // Tab order: toolbar, heatmap, drill-down (head table, its options), worst cells.
    setTabOrder(&m_promptPage->heatmap(), &m_promptPage->drillDown().headView());
    setTabOrder(&m_promptPage->drillDown().headView(), &m_promptPage->suspectsView());
    setTabOrder(&m_promptPage->suspectsView(), &m_promptPage->worstCellsView());

    connect(m_toolbar, &ViewToolbar::settingsChanged, this, &MainWindow::applySettings);
    connect(m_promptPage, &PromptPage::partRequested, m_toolbar, &ViewToolbar::setPart);
    connect(m_promptPage, &PromptPage::autoRangeChosen, m_toolbar, &ViewToolbar::showRange);
    connect(m_promptPage, &PromptPage::selectionChanged, this, &MainWindow::showSummary);
    connect(m_tabs, &QTabWidget::currentChanged, this, [this](int index) { m_toolbar->setAcrossPrompts(index == 1); });
    connect(m_acrossPage, &AcrossPromptsPage::cellChosen, this, &MainWindow::jumpToPrompt);
    connect(m_recent, &RecentFilesMenu::openRequested, this, &MainWindow::openPath);
    connect(m_cancel, &QPushButton::clicked, m_controller, &AnalysisController::cancel);
    connect(m_controller, &AnalysisController::opened, this, &MainWindow::onOpened);
    connect(m_controller, &AnalysisController::progress, this, &MainWindow::onProgress);
    connect(m_controller, &AnalysisController::layerFinished, m_promptPage, &PromptPage::onLayerFinished);
    connect(m_controller, &AnalysisController::rowStarted, m_promptPage, &PromptPage::onRowStarted);
    connect(m_controller, &AnalysisController::finished, this, &MainWindow::onFinished);
    connect(m_controller, &AnalysisController::failed, this, &MainWindow::onFailed);
    connect(m_controller, &AnalysisController::cancelled, this, [this] {
        m_progress->hide();
        m_cancel->hide();
        if (const QString opening = std::exchange(m_opening, QString()); !opening.isEmpty() && m_controller->result()) {
            // cancelled before it opened: what was open stays
            m_status->setText(tr("opening %1 cancelled; still showing %2")
                                  .arg(QFileInfo(opening).fileName(), QFileInfo(m_controller->path()).fileName()));
        } else if (m_controller->result()) {
            m_status->setText(tr("analysis cancelled: the layers done so far are shown"));
            m_promptPage->onCancelled();
        } else {  // cancelled before anything was read (an import)
            m_status->setText(tr("import cancelled"));
            m_promptPage->clear(tr("Import cancelled"));
            setWindowTitle("kvscope");
        }
    });
    // 1400x900, or what the screen has room for: a 1280x800 laptop would otherwise have the
    // side panel, the status bar and Cancel off screen. The allowance is for the window frame.
    const QSize room = screen()->availableGeometry().size() - QSize(16, 48);
    resize(QSize(1400, 900).boundedTo(room));
    restoreLayout();
}

MainWindow::~MainWindow() = default;

void MainWindow::closeEvent(QCloseEvent* event)
{
    saveLayout();
    QMainWindow::closeEvent(event);
}

QList<QSplitter*> MainWindow::splitters() const
{
    return {m_promptPage, &m_promptPage->mapSplitter(), &m_promptPage->drillDown(), m_acrossPage};
}

// Panel sizes are the user's: remembered across runs.
void MainWindow::saveLayout() const
{
    QSettings settings;
    settings.setValue("layout/window", saveGeometry());
    for (const QSplitter* splitter : splitters())
        settings.setValue("layout/" + splitter->objectName(), splitter->saveState());
}

void MainWindow::restoreLayout()
{
    QSettings settings;
    restoreGeometry(settings.value("layout/window").toByteArray());
    for (QSplitter* splitter : splitters())
        splitter->restoreState(settings.value("layout/" + splitter->objectName()).toByteArray());
}

HeatmapView& MainWindow::currentMap()
{
    switch (m_tabs->currentIndex()) {
    case 1: return m_acrossPage->heatmap();
    case 2: return m_whatIfPage->heatmap();
    case 3: return m_comparePage->heatmap();
    default: return m_promptPage->heatmap();
    }
}

void MainWindow::buildMenus()
{
    QMenu* file = menuBar()->addMenu(tr("&File"));
    file->addAction(tr("&Open bundle..."), QKeySequence::Open, this, [this] {
        const QString path = QFileDialog::getOpenFileName(this, tr("Open capture bundle or results file"), {},
                                                          tr("Capture bundles and results (*.h5 *.hdf5 *.kvres);;All files (*)"));
        if (!path.isEmpty())
            openPath(path);
    });
    m_compareAction = file->addAction(tr("&Compare with..."), this, [this] {
        const QString path = QFileDialog::getOpenFileName(this, tr("Compare with (A: before the change)"), {},
                                                          tr("Captures and analyses (*.h5 *.hdf5 *.kvres *.json);;All files (*)"));
        if (!path.isEmpty())
            compareWith(path);
    });
    m_compareAction->setEnabled(false);  // once the open bundle is analysed
    m_saveAction = file->addAction(tr("&Save results..."), QKeySequence::Save, this, &MainWindow::saveResults);
    m_saveAction->setEnabled(false);  // once analysed
    file->addAction(tr("Open se&veral bundles..."), this, [this] {
        const QStringList paths = QFileDialog::getOpenFileNames(this, tr("Open several bundles as one sweep"), {},
                                                                tr("Capture bundles (*.h5);;All files (*)"));
        if (!paths.isEmpty())
            openPaths(paths);
    });
    file->addAction(tr("Open &folder..."), this, [this] {
        const QString dir = QFileDialog::getExistingDirectory(
            this, tr("Open a folder of bundles (a sweep, analysed as one) or of .pt / .safetensors dumps"));
        if (!dir.isEmpty())
            openPath(dir);
    });
    file->addMenu(m_recent);
    file->addSeparator();
    QMenu* exportMenu = file->addMenu(tr("&Export view"));
    for (const QString& format : {QStringLiteral("PNG"), QStringLiteral("PDF"), QStringLiteral("SVG")})
        exportMenu->addAction(format + "...", this, [this, format] {
            const QString path = QFileDialog::getSaveFileName(this, tr("Export view"), "kvscope-view." + format.toLower(),
                                                              format + " (*." + format.toLower() + ")");
            if (!path.isEmpty() && !exportPlot(currentMap(), path))
                QMessageBox::warning(this, tr("Export"), tr("Could not write %1").arg(path));
        });
    exportMenu->addAction(tr("HTML report..."), this, &MainWindow::exportReport);
    file->addSeparator();
    file->addAction(tr("&Quit"), QKeySequence::Quit, qApp, &QApplication::quit);

    QMenu* view = menuBar()->addMenu(tr("&View"));
    QAction* resetZoom = view->addAction(tr("&Reset zoom"), this, [this] { currentMap().resetZoom(); });
    resetZoom->setShortcut(QKeySequence(Qt::CTRL | Qt::Key_0));
    resetZoom->setToolTip(tr("Reset zoom (Home, Ctrl+0, double-click)"));
    m_toolbar->addSeparator();
    m_toolbar->addAction(resetZoom);
    view->addSeparator();
    view->addAction(tr("&Keys (K)"), QKeySequence(Qt::Key_K), this, [this] { m_toolbar->setPart(KvPart::K); });
    view->addAction(tr("&Values (V)"), QKeySequence(Qt::Key_V), this, [this] { m_toolbar->setPart(KvPart::V); });
    QMenu* metrics = view->addMenu(tr("&Metric"));
    int key = Qt::Key_1;
    for (HeatmapMetric m : {HeatmapMetric::RelLinf, HeatmapMetric::RelL2, HeatmapMetric::OneMinusCos,
                            HeatmapMetric::ErrorRatio, HeatmapMetric::BcVsNoise, HeatmapMetric::Bc})
        metrics->addAction(QString::fromStdString(heatmapMetricShortName(m)), QKeySequence(key++), this,
                           [this, m] { m_toolbar->setMetric(m); });
    view->addSeparator();
    view->addAction(tr("&Previous prompt"), QKeySequence(Qt::CTRL | Qt::Key_PageUp), this, [this] { m_toolbar->stepPrompt(-1); });
    view->addAction(tr("&Next prompt"), QKeySequence(Qt::CTRL | Qt::Key_PageDown), this, [this] { m_toolbar->stepPrompt(1); });
    view->addSeparator();
    view->addAction(tr("Per &prompt"), QKeySequence(Qt::CTRL | Qt::Key_1), this, [this] { showAcrossPrompts(false); });
    view->addAction(tr("&Across prompts"), QKeySequence(Qt::CTRL | Qt::Key_2), this, [this] { showAcrossPrompts(true); });

    menuBar()->addMenu(new HelpMenu(this));
}

void MainWindow::applySettings(const ViewSettings& settings)
{
    const bool promptChanged = settings.prompt != m_settings.prompt;
    const bool partChanged = settings.map.part != m_settings.map.part;
    m_settings = settings;
    m_promptPage->apply(settings, promptChanged);
    if (partChanged)
        m_acrossPage->setPart(settings.map.part);
    showSummary();
}

void MainWindow::showSummary()
{
    if (!m_controller->isRunning() && !m_summary.isEmpty())
        m_status->setText(m_summary);
}

void MainWindow::openPath(const QString& path)
{
    openPaths({path});
}

void MainWindow::openPaths(const QStringList& paths)
{
    const QString path = paths.size() > 1 ? tr("%1 and %2 more").arg(paths.front()).arg(paths.size() - 1) : paths.front();
    m_opening = path;
    m_status->setText(tr("opening %1").arg(path));
    m_progress->setRange(0, 0);
    m_progress->show();
    m_cancel->show();
    m_controller->open(paths);
    // A finished analysis stays on screen until this one opens (it may fail to); one still
    // being analysed was dropped by open().
    if (!m_controller->result()) {
        m_promptPage->clear(tr("Opening %1 ...").arg(QFileInfo(path).fileName()));
        m_tabs->setTabEnabled(1, false);
        m_tabs->setCurrentIndex(0);
        m_toolbar->setPrompts({}, 0, false);
        m_toolbar->setEnabled(false);
        m_summary.clear();
        setWindowTitle("kvscope");
    }
}

void MainWindow::onOpened()
{
    const auto result = m_controller->result();
    m_opening.clear();
    m_summary.clear();  // until it is analysed
    m_tabs->setTabEnabled(1, false);
    m_tabs->setCurrentIndex(0);
    m_whatIfPage->reset();
    m_tabs->setTabEnabled(2, true);
    m_comparePage->reset();
    m_tabs->setTabEnabled(3, false);
    m_compareAction->setEnabled(false);
    m_saveAction->setEnabled(false);
    m_toolbar->setEnabled(true);
    setWindowTitle("kvscope - " + QFileInfo(m_controller->path()).fileName());
    if (QFileInfo::exists(m_controller->path()))  // only what opened (not "A and 3 more")
        m_recent->add(m_controller->path());
    QStringList prompts;
    for (const PromptAnalysis& p : result->prompts)
        prompts << QString("%1 (%2 tokens%3)").arg(QString::fromStdString(p.id)).arg(p.tokens).arg(p.threeWay ? "" : ", 2-way");
    m_settings.prompt = -1;  // whatever the toolbar says next is a new prompt
    QStringList parts{"K", "V"};
    if (!result->prompts.empty())
        parts = {QString::fromStdString(partTitle(result->prompts.front(), KvPart::K)),
                 QString::fromStdString(partTitle(result->prompts.front(), KvPart::V))};
    m_toolbar->setPrompts(prompts, result->prompts.empty() ? 0 : result->prompts.front().heads,
                          !result->prompts.empty() && result->prompts.front().threeWay, parts);
    m_promptPage->onOpened();
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
    m_summary = tr("%1: %2 prompt(s), %3 layers analysed")
                    .arg(QFileInfo(m_controller->path()).fileName())
                    .arg(result->prompts.size())
                    .arg(result->prompts.empty() ? 0 : result->prompts.front().layers.size());
    m_status->setText(m_summary);
    m_tabs->setTabEnabled(1, m_acrossPage->refresh());
    m_promptPage->onFinished();
    m_comparePage->reset();
    // A results file without its bundle: what needs the KV (the what-if, B's side of a
    // comparison, the drill-down's histograms) cannot be shown, and the status says why.
    const QString missing = m_controller->bundleMissing();
    m_tabs->setTabEnabled(2, missing.isEmpty());
    // A sweep's analysis is kept as JSON (kvscope analyze DIR --json) and compared bundle by bundle.
    const bool sweep = m_controller->loader() && m_controller->loader()->isSweep();
    m_tabs->setTabEnabled(3, missing.isEmpty() && !sweep);
    m_compareAction->setEnabled(missing.isEmpty() && !sweep);
    m_saveAction->setEnabled(!sweep);
    if (!missing.isEmpty()) {
        m_summary += tr(" (from results; %1: views that need the KV are off)").arg(missing);
        m_status->setText(m_summary);
    }
}

void MainWindow::saveResults()
{
    QString path = QFileDialog::getSaveFileName(this, tr("Save results"),
                                                QFileInfo(m_controller->path()).completeBaseName() + ".kvres",
                                                tr("kvscope results (*.kvres)"));
    if (path.isEmpty())
        return;
    m_status->setText(tr("saving %1").arg(path));
    m_controller->saveResults(path, [this, path](const QString& error) {
        if (!error.isEmpty())
            QMessageBox::warning(this, tr("Save results"), error);
        m_status->setText(error.isEmpty() ? tr("saved %1").arg(path) : m_summary);
    });
}

void MainWindow::compareWith(const QString& pathA)
{
    m_tabs->setCurrentIndex(3);
    m_comparePage->compareWith(pathA);
}

void MainWindow::onFailed(const QString& message)
{
    m_progress->hide();
    m_cancel->hide();
    const QString failedPath = std::exchange(m_opening, QString());
    m_recent->remove(failedPath.isEmpty() ? m_controller->path() : failedPath);
    if (!failedPath.isEmpty() && m_controller->result()) {
        // It never opened: the analysis on screen stays, and says so.
        m_status->setText(tr("could not open %1; still showing %2")
                              .arg(QFileInfo(failedPath).fileName(), QFileInfo(m_controller->path()).fileName()));
    } else {
        m_status->setText(tr("could not open: %1").arg(message));
        m_summary.clear();
        m_promptPage->clear(tr("Could not open %1 (see the message)").arg(QFileInfo(m_controller->path()).fileName()));
        m_tabs->setTabEnabled(1, false);
        m_toolbar->setPrompts({}, 0, false);
        m_toolbar->setEnabled(false);
        setWindowTitle("kvscope");
    }
    auto* box = new QMessageBox(QMessageBox::Critical, tr("kvscope"), tr("This capture cannot be analysed."),
                                QMessageBox::Ok, this);
    box->setInformativeText(message);
    box->setAttribute(Qt::WA_DeleteOnClose);
    box->open();
}

void MainWindow::exportReport()
{
    const auto result = m_controller->result();
    if (!result || m_controller->isRunning()) {
        QMessageBox::information(this, tr("Report"), tr("Wait for the analysis to finish."));
        return;
    }
    // A folder to create or reuse: a save dialog accepts a name that does not exist yet.
    QFileDialog dialog(this, tr("Write the report into the folder"));
    dialog.setAcceptMode(QFileDialog::AcceptSave);
    dialog.setFileMode(QFileDialog::AnyFile);
    dialog.setOption(QFileDialog::ShowDirsOnly);
    dialog.selectFile("kvscope-report");
    if (dialog.exec() != QDialog::Accepted || dialog.selectedFiles().isEmpty())
        return;
    const QString dir = dialog.selectedFiles().first();
    // The PNG images are drawn by the heatmap widget, which lives on this thread.
    QApplication::setOverrideCursor(Qt::WaitCursor);
    try {
        const auto whatIf = m_whatIfPage->result();  // when it was run
        const ReportFiles files = writeReport(*m_controller->loader(), *result, Thresholds{}, dir, whatIf.get());
        QApplication::restoreOverrideCursor();
        m_status->setText(tr("wrote %1").arg(files.html));
    } catch (const std::exception& e) {
        QApplication::restoreOverrideCursor();
        QMessageBox::warning(this, tr("Report"), QString::fromStdString(e.what()));
    }
}

void MainWindow::showAcrossPrompts(bool across)
{
    if (!across || m_tabs->isTabEnabled(1))
        m_tabs->setCurrentIndex(across ? 1 : 0);
}

void MainWindow::jumpToPrompt(int layer, qint64 generation)
{
    // An across-prompts cell pools every prompt: go to the one that is worst there.
    const auto result = m_controller->result();
    if (!result || !result->aggregate)
        return;
    const std::optional<PromptCell> worst = worstPromptAt(result->prompts, m_settings.map.part, layer, generation);
    if (!worst)
        return;
    showAcrossPrompts(false);
    m_toolbar->setPrompt(worst->prompt);
    m_promptPage->selectCell(layer, worst->token);
    m_promptPage->heatmap().setFocus();
    const PromptAnalysis& p = result->prompts[std::size_t(worst->prompt)];
    m_status->setText(tr("%1 at generation index %2 is worst in prompt %3 (token %4)")
                          .arg(QString::fromStdString(p.layers[std::size_t(layer)]))
                          .arg(generation)
                          .arg(QString::fromStdString(p.id))
                          .arg(worst->token));
}

void MainWindow::keyPressEvent(QKeyEvent* event)
{
    // Arrows that reach the window (no focused widget took them) move the selection.
    if (m_tabs->currentIndex() != 0 || !m_promptPage->moveSelection(event->key()))
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

}  // namespace kvscope
