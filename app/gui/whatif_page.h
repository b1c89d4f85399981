#pragma once
// The "What if" page: what storing this model's KV in fp8, int8, int4 or NVFP4 would cost
// (quant/whatif.h). Run on demand, off the GUI thread, with progress and a cancel button; then
// the schemes' verdicts, a layer x scheme table of the median errors in bf16 noise floors
// (coloured, sortable by any column), and the layer x token map of one scheme for one prompt
// and part (the largest floor ratio over heads).

#include "gui/page.h"
#include "gui/run_bar.h"
#include "quant/whatif.h"

#include <QWidget>

#include <memory>

class QComboBox;
class QLabel;
class QTableWidget;

namespace kvscope {

class AnalysisController;
class HeatmapView;

class WhatIfPage : public QWidget, public Page {
    Q_OBJECT

public:
    explicit WhatIfPage(AnalysisController* controller, QWidget* parent = nullptr);

    QWidget* widget() override { return this; }
    QString title() const override { return tr("What if"); }
    QString unavailable() const override;
    HeatmapView& exportedMap() override { return *m_map; }
    // The toolbar's K/V shows that part here too.
    void applyView(const ViewSettings& settings, bool promptChanged) override;
    // A bundle opened: its what-if is not known yet (a run still going is dropped).
    void captureOpened() override { reset(); }
    void captureClosed(const QString&) override { reset(); }
    // The analysis's impact records are read when it ends: the verdicts take them in then.
    void captureAnalysed() override;
    void reset();
    std::shared_ptr<const WhatIfResult> result() const { return m_result; }
    HeatmapView& heatmap() { return *m_map; }

public slots:
    void start();

private:
    void finished(std::shared_ptr<const WhatIfResult> result, const QString& error);
    // The floor, the recipe by output (once the analysis has ended) and each scheme's verdict.
    QString verdicts() const;
    void fillTable();
    void showMap();

    AnalysisController* m_controller;
    RunBar* m_run;
    QLabel* m_verdicts;
    QTableWidget* m_table;
    QComboBox* m_scheme;
    QComboBox* m_prompt;
    QComboBox* m_part;
    HeatmapView* m_map;
    std::shared_ptr<const WhatIfResult> m_result;
};

}  // namespace kvscope
