#pragma once
// The per-prompt page: the layer x token heatmap over the drill-down, and at the side the
// worst cells and what could not be analysed. It shows the controller's analysis of one
// prompt as ViewSettings say; every panel shows the selected cell or says there is none.

#include "analysis/heatmap_grid.h"
#include "analysis/heatmap_pyramid.h"
#include "analysis/map_spec.h"
#include "gui/page.h"
#include "gui/view_toolbar.h"
#include "results/stored_map.h"

#include <QSplitter>

#include <memory>
#include <tuple>

class QLabel;
class QListWidget;
class QTableView;
class QTimer;

namespace kvscope {

class AnalysisController;
class DrillDownPanel;
class HeatmapView;
class ImpactColumn;
class ProvenanceStrip;
class StateStrip;
struct Suspect;
class WorstCellsModel;

class PromptPage : public QSplitter, public Page {
    Q_OBJECT

public:
    PromptPage(AnalysisController* controller, QWidget* parent = nullptr);

    QWidget* widget() override { return this; }
    QString title() const override { return tr("Per prompt"); }
    QString unavailable() const override { return {}; }
    HeatmapView& exportedMap() override { return *m_heatmap; }
    // New settings; `promptChanged`: the selection and zoom start over.
    void applyView(const ViewSettings& settings, bool promptChanged) override;
    void captureOpening(const QString& path, bool kept) override;
    void captureOpened() override;
    void layerAnalysed(int layer) override;
    void captureAnalysed() override;
    void analysisCancelled() override;
    void captureClosed(const QString& why) override { clear(why); }
    // Nothing open: every panel empty, `message` on the map.
    void clear(const QString& message);

    void selectCell(int layer, qint64 token);
    void clearSelection();
    // Arrow keys move the selected cell; false for other keys or without a selection.
    bool moveSelection(int key);
    int selectedLayer() const { return m_layer; }
    qint64 selectedToken() const { return m_token; }
    // What hovering a cell shows.
    QString cellTooltip(int layer, qint64 token) const;
    HeatmapView& heatmap() { return *m_heatmap; }
    // The map shows the current settings and layers: no build running or asked for.
    bool mapUpToDate() const;
    // [layer]: the off thresholds in floors whose units a map in floors is drawn in (empty for the others).
    const std::vector<double>& offThresholds() const { return m_offThresholds; }
    // Whether the map shown is a results file's, read a window at a time (results/stored_map.h).
    bool showsStoredMap() const { return bool(m_stored); }
    // The tokens of a layer still being analysed that the map shown has (0: none).
    qint64 rowStartShown() const { return m_rowStartShown; }
    DrillDownPanel& drillDown() { return *m_drill; }
    WorstCellsModel& worstCells() { return *m_worstModel; }
    QTableView& worstCellsView() { return *m_worstView; }
    QListWidget& suspectsView() { return *m_suspects; }
    ImpactColumn& impactColumn() { return *m_impact; }
    QString suspectEvidence() const;
    // The shown suspect's impact sentence (empty: none shown, or not measured).
    QString suspectImpact() const;
    // Shows suspect `row` of the prompt: selects its worst cell, opens the drill-down on its
    // worst head, highlights its tokens and heads.
    void followSuspect(int row);
    QSplitter& mapSplitter() { return *m_vertical; }

signals:
    // A worst cell of the other part (K/V) was chosen: the toolbar should switch.
    void partRequested(KvPart part);
    // The colour range the map uses when the settings leave it to the data.
    void autoRangeChosen(ValueRange range);
    // Another cell was selected, or none.
    void selectionChanged();
    // The map was drawn anew (more layers, other settings).
    void mapShown();

private:
    // A state checkpoint clicked under the map: its words, and its worst cell's histogram.
    void showStateCheckpoint(const QString& text, const QString& layer, qint64 position, const QString& part, qint64 cell);
    void layOut();
    void connectViews();
    const PromptAnalysis* prompt() const;
    // The start of a layer's row as its windows of tokens are analysed (AnalysisController::rowStarted).
    void showRowStart(int layer, int prompt, const HeatmapSpec& spec, std::shared_ptr<const HeatmapGrid> row);
    // The map of the current settings, built off the GUI thread (its grid at every zoom, its
    // labels and colour range) and shown when ready. One build at a time: a request while one
    // runs waits for it, and replaces one waiting.
    void refreshHeatmap();
    struct BuiltMap;
    void showHeatmap(BuiltMap& built);
    // A redraw as layers finish, and the pause before the next one (see the layer timer).
    void redrawWhileAnalysing();
    void refreshPooling();
    // The tokens in view and the pixel columns they have.
    std::tuple<qint64, qint64, qint64> shownTokens() const;
    // A stored map's window for the view, read off the GUI thread and drawn when it comes.
    void readStoredWindow();
    void refreshSummary();
    void refreshDrillDown();
    void followWorstCell(int row);
    void selectWorstCell();
    void showContextMenu(const QPoint& globalPos);
    // The rows whose label the map never drops: the selected one and the suspect's.
    void pinRowLabels();
    void connectPanelKeys();
    // The drill-down's marked heads: those of `s` (null: none).
    void markSuspectHeads(const Suspect* s);

    AnalysisController* m_controller;
    HeatmapView* m_heatmap;
    ProvenanceStrip* m_provenance;  // under the map
    StateStrip* m_stateStrip;       // under it: a hybrid model's recurrent state
    ImpactColumn* m_impact;         // beside it: what each layer's KV does to the output
    DrillDownPanel* m_drill;
    QSplitter* m_vertical;
    WorstCellsModel* m_worstModel;
    QTableView* m_worstView;
    QLabel* m_worstTitle;
    QListWidget* m_suspects;
    QLabel* m_evidence;
    QLabel* m_suspectImpact;  // under it: what the suspect does to the output
    QLabel* m_problems;
    QLabel* m_notCompared;
    QLabel* m_replicas;  // TP copies that differ from the one analysed  // layers of groups kvscope does not compare (hybrid models)
    QTimer* m_poolTimer;
    QTimer* m_layerTimer;  // coalesces the redraws as layers finish
    bool m_layerPending = false;
    bool m_cancelled = false;
    bool m_followingList = false;
    ViewSettings m_settings;
    HeatmapPyramid m_map;  // the map at every zoom
    std::vector<double> m_offThresholds;  // [layer]: a map in floors is drawn in units of them
    // The start of the row of a layer being analysed in windows, for the current settings.
    struct RowStart {
        int layer = -1;
        std::shared_ptr<const HeatmapGrid> row;
    };
    RowStart m_rowStart;
    qint64 m_rowStartShown = 0;
    std::shared_ptr<const StoredMap> m_stored;  // or, from a results file, read as shown
    bool m_storedGridShown = false;
    double m_buildSeconds = 0;    // what the last build took (the redraws' pause while analysing)
    int m_opening = 0;            // counts bundles opened and closed
    int m_layer = -1;
    qint64 m_token = -1;
};

}  // namespace kvscope
