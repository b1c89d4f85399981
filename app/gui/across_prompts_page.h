#pragma once
// The across-prompts page: BC against the noise floor by generation index x layer with
// divergence counts, and the combined BC per layer. A click on a cell asks to go to the
// prompt where that cell is worst.

#include "analysis/analysis_result.h"
#include "gui/page.h"

#include <QSplitter>

namespace kvscope {

class AnalysisController;
class BcBarView;
class HeatmapView;

class AcrossPromptsPage : public QSplitter, public Page {
    Q_OBJECT

public:
    AcrossPromptsPage(AnalysisController* controller, QWidget* parent = nullptr);

    QWidget* widget() override { return this; }
    QString title() const override { return tr("Across prompts"); }
    QString unavailable() const override;
    HeatmapView& exportedMap() override { return *m_map; }
    bool acrossPrompts() const override { return true; }
    void applyView(const ViewSettings& settings, bool promptChanged) override;
    void captureOpening(const QString&, bool kept) override { m_drawn = m_drawn && kept; }
    void captureOpened() override { m_drawn = false; }
    void captureAnalysed() override { m_drawn = refresh(); }
    void captureClosed(const QString&) override { m_drawn = false; }
    HeatmapView& heatmap() { return *m_map; }

signals:
    void cellChosen(int layer, qint64 generation);

private:
    // The analysis is complete: draw it (false when there is nothing to aggregate).
    bool refresh();
    void showTooltip(int row, qint64 generation, const QPoint& globalPos);

    AnalysisController* m_controller;
    HeatmapView* m_map;
    BcBarView* m_bars;
    KvPart m_part = KvPart::K;
    bool m_drawn = false;  // the finished analysis's pooled BC is shown
};

}  // namespace kvscope
