#pragma once
// The view toolbar: which prompt, K or V, which metric, how heads are reduced, and the colour
// range (from the data unless edited). Every change is one ViewSettings value; the toolbar
// knows nothing of the data.

#include "analysis/map_spec.h"

#include <QToolBar>

#include <array>

class QCheckBox;
class QComboBox;
class QDoubleSpinBox;
class QPushButton;
class QSpinBox;

namespace kvscope {

struct ViewSettings {
    int prompt = -1;
    HeatmapSpec map;
    ValueRange range = defaultRange(ScaleKind::Error);
    bool autoRange = true;  // the range follows the data (map_spec.h: dataRange)
    bool logarithmic = false;
};

class ViewToolbar : public QToolBar {
    Q_OBJECT

public:
    explicit ViewToolbar(QWidget* parent = nullptr);

    ViewSettings settings() const;
    // A bundle was opened: its prompts, heads per layer, and whether it is three-way (else the
    // BCs are off); the error in floors is shown first, either way.
    // `parts`: what K and V are called ("K", "V"; an MLA latent's "c_kv", "k_pe").
    // `bcVsNoiseOff`: why the per-token BC against the noise floor means nothing here (empty:
    // it does); the reference tool's BC needs threeWay only.
    void setPrompts(const QStringList& prompts, int heads, bool threeWay, const QStringList& parts = {"K", "V"},
                    const QString& bcVsNoiseOff = {});
    void setPrompt(int index);
    void stepPrompt(int delta);
    // An action of the view (Reset zoom), before the colour controls: in view on a small screen.
    void addViewAction(QAction* action);
    void setMetric(HeatmapMetric metric);
    void setPart(KvPart part);
    // Shows the range the data chose, without a change of settings.
    void showRange(ValueRange range);
    // The across-prompts page: only K/V applies there.
    void setAcrossPrompts(bool across);
    QComboBox& promptBox() { return *m_prompt; }

signals:
    void settingsChanged(const ViewSettings& settings);

private:
    QAction* m_colourStart = nullptr;
    void emitChanged();

    QComboBox* m_prompt;
    QComboBox* m_part;
    QComboBox* m_metric;
    QComboBox* m_reduction;
    QSpinBox* m_head;
    std::array<QAction*, 2> m_perHead{};  // the reduction and the head: hidden for one vector a token
    QDoubleSpinBox* m_min;
    QDoubleSpinBox* m_max;
    QCheckBox* m_log;
    QPushButton* m_auto;
    bool m_autoRange = true;
};

}  // namespace kvscope
