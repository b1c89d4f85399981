#pragma once
// The desktop app: open a capture bundle and find the problem by looking. The window is a
// frame that wires its parts: the view toolbar, the per-prompt page, the across-prompts
// page, the recent-files menu, the status bar; the controller does the work off this thread.

#include "gui/analysis_controller.h"
#include "gui/prompt_page.h"
#include "gui/recent_files_menu.h"
#include "gui/view_toolbar.h"

#include <QMainWindow>

class QAction;
class QLabel;
class QProgressBar;
class QPushButton;
class QSplitter;
class QTabWidget;

namespace kvscope {

class AcrossPromptsPage;
class ComparePage;
class WhatIfPage;
class HeatmapView;

class MainWindow : public QMainWindow {
    Q_OBJECT

public:
    explicit MainWindow(QWidget* parent = nullptr);
    ~MainWindow() override;

    // Opens a bundle or a folder of dumps; what is open stays until it has opened.
    void openPath(const QString& path);
    // Several bundles: one sweep, analysed as one.
    void openPaths(const QStringList& paths);
    AnalysisController& controller() { return *m_controller; }
    void showAcrossPrompts(bool across);
    // File > Compare with...: the open, analysed bundle is B, `pathA` is A (a capture or its
    // analysis JSON); shown on the Compare page.
    void compareWith(const QString& pathA);
    void saveResults();
    ComparePage& comparePage() { return *m_comparePage; }

protected:
    void dragEnterEvent(QDragEnterEvent* event) override;
    void dropEvent(QDropEvent* event) override;
    void keyPressEvent(QKeyEvent* event) override;
    void closeEvent(QCloseEvent* event) override;

private:
    void buildMenus();
    void applySettings(const ViewSettings& settings);
    void onOpened();
    void onProgress(int done, int total, const QString& what);
    void onFinished();
    void onFailed(const QString& message);
    void exportReport();
    void jumpToPrompt(int layer, qint64 generation);
    HeatmapView& currentMap();
    // The status bar back to what is open (a message about a cell goes stale with the cell).
    void showSummary();
    QList<QSplitter*> splitters() const;
    void saveLayout() const;
    void restoreLayout();

    AnalysisController* m_controller;
    ViewToolbar* m_toolbar;
    PromptPage* m_promptPage;
    AcrossPromptsPage* m_acrossPage;
    WhatIfPage* m_whatIfPage;
    ComparePage* m_comparePage;
    QAction* m_saveAction = nullptr;
    QAction* m_compareAction = nullptr;
    QTabWidget* m_tabs;
    RecentFilesMenu* m_recent;
    QLabel* m_status;
    QProgressBar* m_progress;
    QPushButton* m_cancel;
    ViewSettings m_settings;
    QString m_opening;  // the path asked for, until it has opened
    QString m_summary;  // what is open, for the status bar
};

}  // namespace kvscope
