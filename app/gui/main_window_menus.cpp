// The window's File and View menus (main_window.h): what each entry asks of the controller,
// the pages and the toolbar.

#include "gui/main_window.h"

#include "gui/compare_page.h"
#include "gui/over_time_page.h"
#include "gui/help_menu.h"
#include "gui/whatif_page.h"
#include "widgets/heatmap_view.h"
#include "widgets/plot_export.h"

#include <QApplication>
#include <QFileDialog>
#include <QFileInfo>
#include <QMenuBar>
#include <QMessageBox>

namespace kvscope {

void MainWindow::buildFileMenu()
{
    QMenu* file = menuBar()->addMenu(tr("&File"));
    file->addAction(tr("&Open bundle..."), QKeySequence::Open, this, [this] {
        const QString path = QFileDialog::getOpenFileName(this, tr("Open capture bundle or results file"), {},
                                                          tr("Capture bundles and results (*.h5 *.hdf5 *.kvres);;All files (*)"));
        if (!path.isEmpty())
            openPath(path);
    });
    m_compareAction = file->addAction(tr("&Compare with..."), this, [this] {
        m_tabs->setCurrentWidget(m_pages.compare);
        m_pages.compare->chooseA();
    });
    m_saveAction = file->addAction(tr("&Save results..."), QKeySequence::Save, this, &MainWindow::saveResults);
    // A results file opened without its bundle: the views that need the KV wait for it.
    m_locateAction = file->addAction(tr("&Locate bundle..."), this, [this] {
        const QString path = QFileDialog::getOpenFileName(
            this, tr("Where is the bundle these results were made from? (%1)").arg(m_controller->bundleMissing()),
            QFileInfo(m_controller->resultsFile()).absolutePath(), tr("Capture bundles (*.h5 *.hdf5);;All files (*)"));
        if (!path.isEmpty())
            m_controller->locateBundle(path);
    });
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
            HeatmapView& shown = m_pages.all[std::size_t(m_tabs->currentIndex())]->exportedMap();
            if (!path.isEmpty() && !exportPlot(shown, path))
                QMessageBox::warning(this, tr("Export"), tr("Could not write %1").arg(path));
        });
    exportMenu->addAction(tr("HTML report..."), this, &MainWindow::exportReport);
    file->addSeparator();
    file->addAction(tr("&Quit"), QKeySequence::Quit, qApp, &QApplication::quit);
}

void MainWindow::buildViewMenu()
{
    QMenu* view = menuBar()->addMenu(tr("&View"));
    QAction* resetZoom = view->addAction(tr("&Reset zoom"), this, [this] {
        m_pages.all[std::size_t(m_tabs->currentIndex())]->exportedMap().resetZoom();
    });
    resetZoom->setShortcut(QKeySequence(Qt::CTRL | Qt::Key_0));
    resetZoom->setToolTip(tr("Reset zoom (Home, Ctrl+0, double-click)"));
    m_toolbar->addViewAction(resetZoom);
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
    view->addAction(tr("&What if"), QKeySequence(Qt::CTRL | Qt::Key_3), this, [this] { showPage(m_pages.whatIf); });
    view->addAction(tr("&Compare"), QKeySequence(Qt::CTRL | Qt::Key_4), this, [this] { showPage(m_pages.compare); });
    view->addAction(tr("&Over time"), QKeySequence(Qt::CTRL | Qt::Key_5), this, [this] { showPage(m_pages.overTime); });
    menuBar()->addMenu(new HelpMenu(this));
}

}  // namespace kvscope
