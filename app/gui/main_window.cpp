#include "gui/main_window.h"

#include "analysis/worst_prompt.h"
#include "gui/across_prompts_page.h"
#include "gui/compare_page.h"
#include "gui/over_time_page.h"
#include "gui/drill_down_panel.h"
#include "gui/prompt_page.h"
#include "gui/status_line.h"
#include "gui/whatif_page.h"
#include "widgets/heatmap_view.h"

#include <QApplication>
#include <QDragEnterEvent>
#include <QFileDialog>
#include <QFileInfo>
#include <QMessageBox>
#include <QMimeData>
#include <QScreen>
#include <QSettings>
#include <QStatusBar>
#include <QTabWidget>

namespace kvscope {

MainWindow::MainWindow(QWidget* parent)
    : QMainWindow(parent)
    , m_controller(new AnalysisController(this))
    , m_toolbar(new ViewToolbar(this))
    , m_pages(makePages(m_controller))
    , m_tabs(new QTabWidget)
    , m_recent(new RecentFilesMenu(this))
    , m_status(new StatusLine(m_controller, statusBar()))
{
    setWindowTitle("kvscope");
    setAcceptDrops(true);
    addToolBar(m_toolbar);
    // Viewers in this order: the window (title, toolbar), the status line, then the pages.
    m_controller->addViewer(this);
    m_controller->addViewer(m_status);
    for (Page* page : m_pages.all) {
        m_tabs->addTab(page->widget(), page->title());
        m_controller->addViewer(page);
    }
    setCentralWidget(m_tabs);
    buildFileMenu();
    buildViewMenu();
    emptyToolbar();
    m_settings = m_toolbar->settings();
    PromptPage& prompt = *m_pages.prompt;
    // Tab order: toolbar, heatmap, drill-down (head table, its options), worst cells.
    setTabOrder(&prompt.heatmap(), &prompt.drillDown().headView());
    setTabOrder(&prompt.drillDown().headView(), &prompt.suspectsView());
    setTabOrder(&prompt.suspectsView(), &prompt.worstCellsView());

    connect(m_toolbar, &ViewToolbar::settingsChanged, this, &MainWindow::applySettings);
    connect(&prompt, &PromptPage::partRequested, m_toolbar, &ViewToolbar::setPart);
    connect(&prompt, &PromptPage::autoRangeChosen, m_toolbar, &ViewToolbar::showRange);
    connect(&prompt, &PromptPage::selectionChanged, m_status, &StatusLine::showSummary);
    connect(m_tabs, &QTabWidget::currentChanged, this,
            [this](int index) { m_toolbar->setAcrossPrompts(m_pages.all[std::size_t(index)]->acrossPrompts()); });
    connect(m_pages.across, &AcrossPromptsPage::cellChosen, this, &MainWindow::jumpToPrompt);
    connect(m_pages.overTime, &OverTimePage::timelineShown, this, &MainWindow::refreshTabs);  // (computed after the analysis)
    connect(m_recent, &RecentFilesMenu::openRequested, this, &MainWindow::openPath);
    // After every viewer has seen the event: the tabs as the pages now say.
    for (auto signal : {&AnalysisController::opened, &AnalysisController::failed})
        connect(m_controller, signal, this, &MainWindow::refreshTabs);
    for (auto signal : {&AnalysisController::finished, &AnalysisController::cancelled})
        connect(m_controller, signal, this, &MainWindow::refreshTabs);
    connect(m_controller, &AnalysisController::failed, this, &MainWindow::showFailure);
    connect(m_controller, &AnalysisController::bundleLocated, this, [this] {
        refreshTabs();
        m_status->bundleLocated();
    });
    refreshTabs();
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
    return {m_pages.prompt, &m_pages.prompt->mapSplitter(), &m_pages.prompt->drillDown(), m_pages.across};
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
    // Saved on a larger screen: within this one (the allowance is for the window frame).
    const QRect room = screen()->availableGeometry().adjusted(0, 0, -16, -48);
    if (!isMaximized() && !room.contains(geometry())) {
        resize(size().boundedTo(room.size()));
        move(std::clamp(x(), room.left(), std::max(room.left(), room.right() - width())),
             std::clamp(y(), room.top(), std::max(room.top(), room.bottom() - height())));
    }
    for (QSplitter* splitter : splitters())
        splitter->restoreState(settings.value("layout/" + splitter->objectName()).toByteArray());
}

void MainWindow::applySettings(const ViewSettings& settings)
{
    const bool promptChanged = settings.prompt != m_settings.prompt;
    m_settings = settings;
    for (Page* page : m_pages.all)
        page->applyView(settings, promptChanged);
    m_status->showSummary();
}

void MainWindow::refreshTabs()
{
    for (std::size_t i = 0; i < m_pages.all.size(); ++i) {
        const QString why = m_pages.all[i]->unavailable();
        m_tabs->setTabEnabled(int(i), why.isEmpty());
        m_tabs->setTabToolTip(int(i), why);
    }
    const auto result = m_controller->result();
    const bool sweep = m_controller->loader() && m_controller->loader()->isSweep();
    m_saveAction->setEnabled(result && !m_controller->isRunning() && !sweep);
    m_locateAction->setEnabled(result && !m_controller->isRunning() && !m_controller->bundleMissing().isEmpty());
    m_compareAction->setEnabled(m_pages.compare->unavailable().isEmpty());
}

void MainWindow::emptyToolbar()
{
    m_toolbar->setPrompts({}, 0, false);
    m_toolbar->setEnabled(false);  // nothing to view
    setWindowTitle("kvscope");
}

void MainWindow::captureOpening(const QString& path, bool kept)
{
    m_opening = path;
    if (!kept) {
        m_tabs->setCurrentIndex(0);
        emptyToolbar();
    }
    refreshTabs();
}

void MainWindow::captureOpened()
{
    const auto result = m_controller->result();
    m_opening.clear();
    m_tabs->setCurrentIndex(0);
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
    QString bcVsNoiseOff;
    if (!result->prompts.empty() && !tokenBcMeaningful(result->prompts.front()))
        bcVsNoiseOff = tr("a token has %1 values, too few for a per-token BC to mean anything (two draws of the same "
                          "noise already differ; at least %2 needed); the Across prompts page's combined BC pools every token")
                           .arg(smallestTokenValues(result->prompts.front()))
                           .arg(kMinValuesForTokenBc);
    m_toolbar->setPrompts(prompts, result->prompts.empty() ? 0 : result->prompts.front().heads,
                          !result->prompts.empty() && result->prompts.front().threeWay, parts, bcVsNoiseOff);
}

void MainWindow::showFailure(const QString& message)
{
    const QString failedPath = std::exchange(m_opening, QString());
    m_recent->remove(failedPath.isEmpty() ? m_controller->path() : failedPath);
    if (!m_controller->result())
        emptyToolbar();
    auto* box = new QMessageBox(QMessageBox::Critical, tr("kvscope"), tr("This capture cannot be analysed."),
                                QMessageBox::Ok, this);
    box->setInformativeText(message);
    box->setAttribute(Qt::WA_DeleteOnClose);
    box->open();
}

void MainWindow::saveResults()
{
    QString path = QFileDialog::getSaveFileName(this, tr("Save results"),
                                                QFileInfo(m_controller->path()).completeBaseName() + ".kvres",
                                                tr("kvscope results (*.kvres)"));
    if (path.isEmpty())
        return;
    m_status->showMessage(tr("saving %1").arg(path));
    m_controller->saveResults(path, [this, path](const QString& error) {
        if (!error.isEmpty())
            QMessageBox::warning(this, tr("Save results"), error);
        m_status->showMessage(error.isEmpty() ? tr("saved %1").arg(path) : m_status->summary());
    });
}

void MainWindow::compareWith(const QString& pathA)
{
    m_tabs->setCurrentWidget(m_pages.compare);
    m_pages.compare->compareWith(pathA);
}

void MainWindow::exportReport()
{
    if (!m_controller->result() || m_controller->isRunning()) {
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
    m_status->showMessage(tr("writing the report into %1 ...").arg(dir));
    // With the what-if when it was run here (the report runs it again, as kvscope report does).
    m_controller->writeReport(dir, bool(m_pages.whatIf->result()), [this](const QString& html, const QString& error) {
        if (!error.isEmpty())
            QMessageBox::warning(this, tr("Report"), error);
        m_status->showMessage(error.isEmpty() ? tr("wrote %1").arg(html) : m_status->summary());
    });
}

void MainWindow::showPage(QWidget* page)
{
    if (m_tabs->isTabEnabled(m_tabs->indexOf(page)))  // (a page that cannot show this capture says why in its tab)
        m_tabs->setCurrentWidget(page);
}

void MainWindow::showAcrossPrompts(bool across)
{
    if (!across || m_tabs->isTabEnabled(m_tabs->indexOf(m_pages.across)))
        m_tabs->setCurrentWidget(across ? static_cast<QWidget*>(m_pages.across) : m_pages.prompt);
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
    m_pages.prompt->selectCell(layer, worst->token);
    m_pages.prompt->heatmap().setFocus();
    const PromptAnalysis& p = result->prompts[std::size_t(worst->prompt)];
    m_status->showMessage(tr("%1 at generation index %2 is worst in prompt %3 (token %4)")
                              .arg(QString::fromStdString(p.layers[std::size_t(layer)]))
                              .arg(generation)
                              .arg(QString::fromStdString(p.id))
                              .arg(worst->token));
}

void MainWindow::keyPressEvent(QKeyEvent* event)
{
    // Arrows that reach the window (no focused widget took them) move the selection.
    if (m_tabs->currentWidget() != m_pages.prompt || !m_pages.prompt->moveSelection(event->key()))
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
