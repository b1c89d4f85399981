#pragma once
// The "Compare" page (File > Compare with...), in two modes, off the GUI thread with a cancel
// button:
// - regressions: the open bundle is B, another capture of the same prompts (or its analysis
//   JSON) is A, compared as kvscope diff does (diff/capture_diff.h). Then the result, the layers
//   with the regressions first, the B - A map in floors on a diverging scale centred on 0 (or A's
//   or B's map), and for a clicked cell A and B side by side: the cell's ratio in each, and the
//   layer's ratios across the tokens of both;
// - transfer: the open bundle is the consumer of a KV transfer, another capture of the same
//   requests the producer, compared bit for bit as kvscope transfer does (gui/transfer_view.h).

#include "diff/capture_diff.h"
#include "gui/page.h"
#include "gui/run_bar.h"

#include <QWidget>

#include <memory>

class QComboBox;
class QLabel;
class QStackedWidget;
class QTableWidget;

namespace kvscope {

class AnalysisController;
class HeatmapView;
class TokenLineView;
class TransferView;

class ComparePage : public QWidget, public Page {
    Q_OBJECT

public:
    explicit ComparePage(AnalysisController* controller, QWidget* parent = nullptr);

    QWidget* widget() override { return this; }
    QString title() const override { return tr("Compare"); }
    QString unavailable() const override;
    HeatmapView& exportedMap() override;
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
    // Transfer mode: compares the open bundle (the consumer) with `producerPath`; the result arrives later.
    void compareTransferWith(const QString& producerPath);
    enum class Mode { Regressions, Transfer };
    void setMode(Mode mode);
    Mode mode() const;
    std::shared_ptr<const DiffResult> result() const { return m_result; }
    HeatmapView& heatmap() { return *m_map; }
    TransferView& transferView() { return *m_transferView; }

signals:
    void comparisonFinished();

private:
    void finished(std::shared_ptr<const DiffResult> result, const QString& error);
    void fillTable();
    void showMap();
    void showCell(int row, qint64 token);

    AnalysisController* m_controller;
    QComboBox* m_mode;
    RunBar* m_run;
    QStackedWidget* m_views;  // the regressions' widgets, the transfer view
    TransferView* m_transferView;
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
