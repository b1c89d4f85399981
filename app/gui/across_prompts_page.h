#pragma once
// The across-prompts page: BC against the noise floor by generation index x layer with
// divergence counts, and the combined BC per layer. A click on a cell asks to go to the
// prompt where that cell is worst.

#include "analysis/analysis_result.h"

#include <QSplitter>

namespace kvscope {

class AnalysisController;
class BcBarView;
class HeatmapView;

class AcrossPromptsPage : public QSplitter {
    Q_OBJECT

public:
    AcrossPromptsPage(AnalysisController* controller, QWidget* parent = nullptr);

    void setPart(KvPart part);
    // The analysis is complete: draw it (false when there is nothing to aggregate).
    bool refresh();
    HeatmapView& heatmap() { return *m_map; }

signals:
    void cellChosen(int layer, qint64 generation);

private:
    void showTooltip(int row, qint64 generation, const QPoint& globalPos);

    AnalysisController* m_controller;
    HeatmapView* m_map;
    BcBarView* m_bars;
    KvPart m_part = KvPart::K;
};

}  // namespace kvscope
