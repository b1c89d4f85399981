#pragma once
// The drill-down under the heatmap for one selected cell: every metric of every head (table,
// the current part's columns), that head's error histograms (computed off the GUI thread),
// and the metric across the sequence (token line). A new cell starts on its worst head;
// choosing a row of the table shows that head; switching metric or K/V keeps it.

#include "analysis/heatmap_grid.h"

#include <QSplitter>

#include <memory>

class QCheckBox;
class QLabel;
class QSortFilterProxyModel;
class QTableView;

namespace kvscope {

class AnalysisController;
class HeadTableModel;
class HistogramView;
class TokenLineView;
struct AnalysisResult;
struct HeadErrorHistogram;

class DrillDownPanel : public QSplitter {
    Q_OBJECT

public:
    // The histograms are read by `controller`, from its open bundle.
    explicit DrillDownPanel(AnalysisController& controller, QWidget* parent = nullptr);

    // Shows cell (layer, token) of prompt `promptIndex` as `spec` reduces it over heads.
    void showCell(std::shared_ptr<const AnalysisResult> result, int promptIndex, const HeatmapSpec& spec, int layer,
                  qint64 token);
    // Nothing selected: every part empty, saying so.
    void clear(const QString& why = {});
    void showHead(int head);
    // Heads to mark in the table (a suspect's); cleared with the cell.
    // Marks `heads` (a star and yellow) as those `whose` names ("the suspect's, from
    // model.layers.13"), and says so under the table; empty: none.
    void highlightHeads(const std::vector<int>& heads, const QString& whose = {});
    int head() const { return m_head; }
    HeadTableModel& headTable() { return *m_headModel; }
    QTableView& headView() { return *m_headView; }
    HistogramView& histogram() { return *m_histogram; }
    TokenLineView& line() { return *m_line; }

signals:
    void histogramShown();

private:
    void requestHistogram();
    // The histogram read in the background for request `request`, or why it could not be read.
    void showHistogram(int request, const std::shared_ptr<const HeadErrorHistogram>& histogram, const QString& error);
    void showLine();
    void showPartColumns();
    // The table's minimum width: its columns whole (within what the screen has room for).
    void fitHeadTable();

    HeadTableModel* m_headModel;
    QSortFilterProxyModel* m_headProxy;
    QTableView* m_headView;
    QLabel* m_floor;
    QLabel* m_headMarks;
    HistogramView* m_histogram;
    QCheckBox* m_logCounts;
    QCheckBox* m_logErrors;
    QCheckBox* m_wholeSequence;
    TokenLineView* m_line;
    QString m_histogramTitle;
    int m_histogramRequest = 0;  // the latest; older readings are dropped
    AnalysisController& m_controller;
    // The cell shown, for the histogram request.
    std::shared_ptr<const AnalysisResult> m_result;
    HeatmapSpec m_spec;
    int m_prompt = -1;
    int m_layer = -1;
    qint64 m_token = -1;
    int m_head = -1;
    bool m_selectingRow = false;
};

}  // namespace kvscope
