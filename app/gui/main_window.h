#pragma once
// The desktop app: open a capture bundle and find the problem by looking. The window is a
// frame that wires its parts: the view toolbar, the per-prompt page, the across-prompts
// page, the recent-files menu, the status bar; the controller does the work off this thread.

#include "gui/analysis_controller.h"
#include "gui/prompt_page.h"
#include "gui/recent_files_menu.h"
#include "gui/view_toolbar.h"

#include <QMainWindow>

class QLabel;
class QProgressBar;
class QPushButton;
class QSplitter;
class QTabWidget;

namespace kvscope {

class AcrossPromptsPage;
class HeadTableModel;
class HeatmapView;
class WorstCellsModel;

class MainWindow : public QMainWindow {
    Q_OBJECT

public:
    explicit MainWindow(QWidget* parent = nullptr);
    ~MainWindow() override;

    void openPath(const QString& path);
    AnalysisController& controller() { return *m_controller; }
    HeatmapView& heatmap();
    HeatmapView& aggregateHeatmap();
    HeadTableModel& headTable();
    WorstCellsModel& worstCells();

    // The current view (per-prompt heatmap or aggregated) to PNG, PDF or SVG by extension.
    bool exportView(const QString& path);
    // Selectors, for the tests and the keyboard.
    void setPrompt(int index) { m_toolbar->setPrompt(index); }
    void setMetric(HeatmapMetric metric) { m_toolbar->setMetric(metric); }
    void setPart(KvPart part) { m_toolbar->setPart(part); }
    ViewToolbar& toolbar() { return *m_toolbar; }
    PromptPage& promptPage() { return *m_promptPage; }
    AcrossPromptsPage& acrossPage() { return *m_acrossPage; }
    RecentFilesMenu& recentFiles() { return *m_recent; }
    void selectCell(int layer, qint64 token);
    int selectedLayer() const;
    qint64 selectedToken() const;
    HeatmapSpec spec() const { return m_settings.map; }
    void showAcrossPrompts(bool across);

signals:
    void histogramShown();

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
    QList<QSplitter*> splitters() const;
    void saveLayout() const;
    void restoreLayout();

    AnalysisController* m_controller;
    ViewToolbar* m_toolbar;
    PromptPage* m_promptPage;
    AcrossPromptsPage* m_acrossPage;
    QTabWidget* m_tabs;
    RecentFilesMenu* m_recent;
    QLabel* m_status;
    QProgressBar* m_progress;
    QPushButton* m_cancel;
    ViewSettings m_settings;
};

}  // namespace kvscope
