#pragma once
// The "Compare" page (File > Compare with...): the open bundle is B, another capture of the
// same prompts (or its analysis JSON) is A, compared as kvscope diff does (diff/capture_diff.h),
// off the GUI thread with a cancel button. Then the result, the layers with the regressions
// first, the B - A map in floors on a diverging scale centred on 0 (or A's or B's map), and for
// a clicked cell A and B side by side: the cell's ratio in each, and the layer's ratios across
// the tokens of both.

#include "diff/capture_diff.h"
#include "gui/page.h"
#include "gui/run_bar.h"

#include <QWidget>

#include <memory>

class QComboBox;
class QLabel;
class QTableWidget;

namespace kvscope {

class AnalysisController;
class HeatmapView;
class TokenLineView;

class ComparePage : public QWidget, public Page {
    Q_OBJECT

public:
    explicit ComparePage(AnalysisController* controller, QWidget* parent = nullptr);

    QWidget* widget() override { return this; }
    QString title() const override { return tr("Compare"); }
    QString unavailable() const override;
    HeatmapView& exportedMap() override { return *m_map; }
    // The toolbar's K/V shows that part here too.
    void applyView(const ViewSettings& settings, bool promptChanged) override;
    // A bundle opened, or its analysis finished: nothing compared yet (a comparison still
    // running is dropped).
    void captureOpened() override { reset(); }
    void captureAnalysed() override { reset(); }
    void captureClosed(const QString&) override { reset(); }
    void reset();
    // Asks for A (beside the open bundle), then compares with it.
    void chooseA();
    // Compares the open, analysed bundle (B) with `pathA`; the result arrives later.
    void compareWith(const QString& pathA);
    std::shared_ptr<const DiffResult> result() const { return m_result; }
    HeatmapView& heatmap() { return *m_map; }

signals:
    void comparisonFinished();

private:
    void finished(std::shared_ptr<const DiffResult> result, const QString& error);
    void fillTable();
    void showMap();
    void showCell(int row, qint64 token);

    AnalysisController* m_controller;
    RunBar* m_run;
    QLabel* m_summary;
    QTableWidget* m_table;
    QComboBox* m_prompt;
    QComboBox* m_part;
    QComboBox* m_kind;
    HeatmapView* m_map;
    QLabel* m_cell;
    TokenLineView* m_line;
    std::shared_ptr<const DiffResult> m_result;
};

}  // namespace kvscope
