#pragma once
// The desktop app: open a capture bundle and find the problem by looking.

#include "gui/analysis_controller.h"
#include "analysis/heatmap_grid.h"

#include <QFutureWatcher>
#include <QMainWindow>

class QCheckBox;
class QComboBox;
class QDoubleSpinBox;
class QLabel;
class QMenu;
class QProgressBar;
class QPushButton;
class QSortFilterProxyModel;
class QSpinBox;
class QTabWidget;
class QTableView;
class QTimer;

namespace kvscope {

class BcBarView;
class HeadTableModel;
class HeatmapView;
class HistogramView;
class TokenLineView;
class WorstCellsModel;
struct HeadErrorHistogram;

class MainWindow : public QMainWindow {
    Q_OBJECT

public:
    explicit MainWindow(QWidget* parent = nullptr);
    ~MainWindow() override;

    void openPath(const QString& path);
    AnalysisController& controller() { return *m_controller; }
    HeatmapView& heatmap() { return *m_heatmap; }
    HeatmapView& aggregateHeatmap() { return *m_aggregate; }
    HeadTableModel& headTable() { return *m_headModel; }
    WorstCellsModel& worstCells() { return *m_worstModel; }

    // The current view (per-prompt heatmap or aggregated) to PNG, PDF or SVG by extension.
    bool exportView(const QString& path);
    // Selectors, for the tests and the keyboard.
    void setPrompt(int index);
    void setMetric(HeatmapMetric metric);
    void setPart(KvPart part);
    void selectCell(int layer, qint64 token);
    int selectedLayer() const { return m_selLayer; }
    qint64 selectedToken() const { return m_selToken; }
    HeatmapSpec spec() const;
    void showAcrossPrompts(bool across);

signals:
    void histogramShown();

protected:
    void dragEnterEvent(QDragEnterEvent* event) override;
    void dropEvent(QDropEvent* event) override;
    void keyPressEvent(QKeyEvent* event) override;

private:
    void buildUi();
    void buildMenus();
    void onOpened();
    void onProgress(int done, int total, const QString& what);
    void onFinished();
    void onFailed(const QString& message);
    void refreshHeatmap();
    void refreshPooling();
    void refreshScale();
    void refreshDrillDown();
    void refreshSummary();
    void refreshAggregate();
    void requestHistogram();
    void showTooltip(int row, qint64 token, const QPoint& globalPos);
    void addRecent(const QString& path);
    void rebuildRecentMenu();
    const PromptAnalysis* prompt() const;

    AnalysisController* m_controller;
    HeatmapView* m_heatmap;
    HeatmapView* m_aggregate;
    BcBarView* m_bcBars;
    HistogramView* m_histogram;
    TokenLineView* m_line;
    HeadTableModel* m_headModel;
    QSortFilterProxyModel* m_headProxy;
    QTableView* m_headView;
    WorstCellsModel* m_worstModel;
    QTableView* m_worstView;
    QLabel* m_issues;
    QTabWidget* m_tabs;
    QComboBox* m_promptBox;
    QComboBox* m_partBox;
    QComboBox* m_metricBox;
    QComboBox* m_reductionBox;
    QSpinBox* m_headBox;
    QDoubleSpinBox* m_minBox;
    QDoubleSpinBox* m_maxBox;
    QCheckBox* m_logBox;
    QCheckBox* m_logCounts;
    QCheckBox* m_wholeSequence;
    QLabel* m_status;
    QProgressBar* m_progress;
    QPushButton* m_cancel;
    QMenu* m_recentMenu;
    QTimer* m_poolTimer;
    HeatmapGrid m_fullGrid;
    int m_selLayer = -1;
    qint64 m_selToken = -1;
    QFutureWatcher<std::shared_ptr<HeadErrorHistogram>>* m_histogramWatcher;
    QString m_histogramTitle;
};

}  // namespace kvscope
