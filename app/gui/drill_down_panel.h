#pragma once
// The drill-down under the heatmap for one selected cell: every metric of every head (table),
// that head's error histograms (computed off the GUI thread), and the metric across the
// sequence (token line).

#include "analysis/heatmap_grid.h"

#include <QFutureWatcher>
#include <QSplitter>

#include <memory>

class QCheckBox;
class QSortFilterProxyModel;
class QTableView;

namespace kvscope {

class BundleReader;
class HeadTableModel;
class HistogramView;
class TokenLineView;
struct AnalysisResult;
struct HeadErrorHistogram;

class DrillDownPanel : public QSplitter {
    Q_OBJECT

public:
    explicit DrillDownPanel(QWidget* parent = nullptr);

    // Shows cell (layer, token) of prompt `promptIndex` as `spec` reduces it over heads.
    void showCell(std::shared_ptr<const BundleReader> reader, std::shared_ptr<const AnalysisResult> result,
                  int promptIndex, const HeatmapSpec& spec, int layer, qint64 token);
    // Nothing selected: every part empty, saying so.
    void clear(const QString& why = {});
    HeadTableModel& headTable() { return *m_headModel; }

signals:
    void histogramShown();

private:
    void requestHistogram();

    HeadTableModel* m_headModel;
    QSortFilterProxyModel* m_headProxy;
    QTableView* m_headView;
    HistogramView* m_histogram;
    QCheckBox* m_logCounts;
    QCheckBox* m_wholeSequence;
    TokenLineView* m_line;
    QFutureWatcher<std::shared_ptr<HeadErrorHistogram>>* m_watcher;
    QString m_histogramTitle;
    // The cell shown, for the histogram request.
    std::shared_ptr<const BundleReader> m_reader;
    std::shared_ptr<const AnalysisResult> m_result;
    int m_prompt = -1;
    int m_layer = -1;
    qint64 m_token = -1;
    int m_head = -1;
    KvPart m_part = KvPart::K;
};

}  // namespace kvscope
