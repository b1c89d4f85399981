#include "gui/main_window.h"

#include "gui/across_prompts_page.h"
#include "gui/drill_down_panel.h"
#include "gui/prompt_page.h"
#include "gui/recent_files_menu.h"
#include "report/report_writer.h"
#include "widgets/heatmap_view.h"

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
#include <QStatusBar>
#include <QSvgGenerator>
#include <QTabWidget>

namespace kvscope {

MainWindow::MainWindow(QWidget* parent)
    : QMainWindow(parent)
    , m_controller(new AnalysisController(this))
    , m_toolbar(new ViewToolbar(this))
    , m_promptPage(new PromptPage(m_controller))
    , m_acrossPage(new AcrossPromptsPage(m_controller))
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
    setCentralWidget(m_tabs);
    m_progress->setMaximumWidth(240);
    statusBar()->addWidget(m_status, 1);
    statusBar()->addPermanentWidget(m_progress);
    statusBar()->addPermanentWidget(m_cancel);
    m_progress->hide();
    m_cancel->hide();
    buildMenus();
    m_settings = m_toolbar->settings();

    connect(m_toolbar, &ViewToolbar::settingsChanged, this, &MainWindow::applySettings);
    connect(m_promptPage, &PromptPage::partRequested, this, &MainWindow::setPart);
    connect(&m_promptPage->drillDown(), &DrillDownPanel::histogramShown, this, &MainWindow::histogramShown);
    connect(m_recent, &RecentFilesMenu::openRequested, this, &MainWindow::openPath);
    connect(m_cancel, &QPushButton::clicked, m_controller, &AnalysisController::cancel);
    connect(m_controller, &AnalysisController::opened, this, &MainWindow::onOpened);
    connect(m_controller, &AnalysisController::progress, this, &MainWindow::onProgress);
    connect(m_controller, &AnalysisController::layerFinished, m_promptPage, &PromptPage::onLayerFinished);
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

HeatmapView& MainWindow::heatmap() { return m_promptPage->heatmap(); }
HeatmapView& MainWindow::aggregateHeatmap() { return m_acrossPage->heatmap(); }
HeadTableModel& MainWindow::headTable() { return m_promptPage->drillDown().headTable(); }
WorstCellsModel& MainWindow::worstCells() { return m_promptPage->worstCells(); }
void MainWindow::selectCell(int layer, qint64 token) { m_promptPage->selectCell(layer, token); }
int MainWindow::selectedLayer() const { return m_promptPage->selectedLayer(); }
qint64 MainWindow::selectedToken() const { return m_promptPage->selectedToken(); }

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
    file->addMenu(m_recent);
    file->addSeparator();
    QMenu* exportMenu = file->addMenu(tr("&Export view"));
    for (const QString& format : {QStringLiteral("PNG"), QStringLiteral("PDF"), QStringLiteral("SVG")})
        exportMenu->addAction(format + "...", this, [this, format] {
            const QString path = QFileDialog::getSaveFileName(this, tr("Export view"), "kvscope-view." + format.toLower(),
                                                              format + " (*." + format.toLower() + ")");
            if (!path.isEmpty() && !exportView(path))
                QMessageBox::warning(this, tr("Export"), tr("Could not write %1").arg(path));
        });
    exportMenu->addAction(tr("HTML report..."), this, &MainWindow::exportReport);
    file->addSeparator();
    file->addAction(tr("&Quit"), QKeySequence::Quit, qApp, &QApplication::quit);
}

void MainWindow::applySettings(const ViewSettings& settings)
{
    const bool promptChanged = settings.prompt != m_settings.prompt;
    const bool partChanged = settings.map.part != m_settings.map.part;
    m_settings = settings;
    m_promptPage->apply(settings, promptChanged);
    if (partChanged)
        m_acrossPage->setPart(settings.map.part);
}

void MainWindow::openPath(const QString& path)
{
    m_status->setText(tr("opening %1").arg(path));
    m_progress->setRange(0, 0);
    m_progress->show();
    m_cancel->show();
    m_promptPage->clear();
    m_recent->add(path);
    m_controller->open(path);
}

void MainWindow::onOpened()
{
    const auto result = m_controller->result();
    setWindowTitle("kvscope - " + QFileInfo(m_controller->path()).fileName());
    QStringList prompts;
    for (const PromptAnalysis& p : result->prompts)
        prompts << QString("%1 (%2, %3 tokens)").arg(QString::fromStdString(p.id), p.threeWay ? "3-way" : "2-way").arg(p.tokens);
    m_settings.prompt = -1;  // whatever the toolbar says next is a new prompt
    m_toolbar->setPrompts(prompts, result->prompts.empty() ? 0 : result->prompts.front().heads,
                          !result->prompts.empty() && result->prompts.front().threeWay);
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
    m_status->setText(tr("%1: %2 prompt(s), %3 layers analysed")
                          .arg(QFileInfo(m_controller->path()).fileName())
                          .arg(result->prompts.size())
                          .arg(result->prompts.empty() ? 0 : result->prompts.front().layers.size()));
    m_tabs->setTabEnabled(1, m_acrossPage->refresh());
    m_promptPage->onFinished();
}

void MainWindow::onFailed(const QString& message)
{
    m_progress->hide();
    m_cancel->hide();
    m_status->setText(tr("could not open: %1").arg(message));
    m_recent->remove(m_controller->path());
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
}

bool MainWindow::exportView(const QString& path)
{
    QCustomPlot* plot = m_tabs->currentIndex() == 1 ? &aggregateHeatmap() : &heatmap();
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

void MainWindow::keyPressEvent(QKeyEvent* event)
{
    if (!m_promptPage->moveSelection(event->key()))
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
