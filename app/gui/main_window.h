#pragma once
// The desktop app: open a capture bundle and find the problem by looking. The window is a
// frame: it gives each page (pages.h) a tab, registers it with the controller as a viewer of
// the open capture, wires the menus and the view toolbar, and keeps the tabs current; the
// controller and its door do the work off this thread.

#include "gui/analysis_controller.h"
#include "gui/pages.h"
#include "gui/recent_files_menu.h"
#include "gui/view_toolbar.h"

#include <QMainWindow>

class QAction;
class QSplitter;
class QTabWidget;

namespace kvscope {

class ComparePage;
class HeatmapView;
class StatusLine;

class MainWindow : public QMainWindow, public CaptureViewer {
    Q_OBJECT

public:
    explicit MainWindow(QWidget* parent = nullptr);
    ~MainWindow() override;

    // Opens a bundle or a folder of dumps; what is open stays until it has opened.
    void openPath(const QString& path) { openPaths({path}); }
    // Several bundles: one sweep, analysed as one.
    void openPaths(const QStringList& paths) { m_controller->open(paths); }
    AnalysisController& controller() { return *m_controller; }
    void showAcrossPrompts(bool across);
    // To that page's tab, when it is on (the View menu's Ctrl+3, Ctrl+4).
    void showPage(QWidget* page);
    // File > Compare with...: the open, analysed bundle is B, `pathA` is A (a capture or its
    // analysis JSON); shown on the Compare page.
    void compareWith(const QString& pathA);
    void saveResults();
    ComparePage& comparePage() { return *m_pages.compare; }

    void captureOpening(const QString& path, bool kept) override;
    void captureOpened() override;

protected:
    void dragEnterEvent(QDragEnterEvent* event) override;
    void dropEvent(QDropEvent* event) override;
    void keyPressEvent(QKeyEvent* event) override;
    void closeEvent(QCloseEvent* event) override;

private:
    void buildFileMenu();
    void buildViewMenu();
    void applySettings(const ViewSettings& settings);
    // The tabs on or off as their pages say (why not: the tab's tooltip), and what needs a
    // finished analysis.
    void refreshTabs();
    void showFailure(const QString& message);
    void exportReport();
    void jumpToPrompt(int layer, qint64 generation);
    void emptyToolbar();
    QList<QSplitter*> splitters() const;
    void saveLayout() const;
    void restoreLayout();

    AnalysisController* m_controller;  // the first child: it goes first, waiting for its requests
    ViewToolbar* m_toolbar;
    Pages m_pages;
    QAction* m_locateAction = nullptr;
    QAction* m_saveAction = nullptr;
    QAction* m_compareAction = nullptr;
    QTabWidget* m_tabs;
    RecentFilesMenu* m_recent;
    StatusLine* m_status;
    ViewSettings m_settings;
    QString m_opening;  // the path asked for, until it has opened
};

}  // namespace kvscope
