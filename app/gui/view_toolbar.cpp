#include "gui/view_toolbar.h"

#include <QAbstractItemView>
#include <QCheckBox>
#include <QComboBox>
#include <QDoubleSpinBox>
#include <QLabel>
#include <QPushButton>
#include <QSignalBlocker>
#include <QStandardItemModel>
#include <QSpinBox>

namespace kvscope {

ViewToolbar::ViewToolbar(QWidget* parent)
    : QToolBar(tr("View"), parent)
    , m_prompt(new QComboBox)
    , m_part(new QComboBox)
    , m_metric(new QComboBox)
    , m_reduction(new QComboBox)
    , m_head(new QSpinBox)
    , m_min(new QDoubleSpinBox)
    , m_max(new QDoubleSpinBox)
    , m_log(new QCheckBox(tr("log")))
    , m_auto(new QPushButton(tr("auto range")))
{
    setObjectName("view");
    m_metric->setObjectName("metric");
    for (QComboBox* box : {m_prompt, m_part, m_metric, m_reduction})
        box->setSizeAdjustPolicy(QComboBox::AdjustToContents);
    m_prompt->setToolTip(tr("Prompt (Page Up / Page Down)"));
    m_part->addItem("K", int(KvPart::K));
    m_part->addItem("V", int(KvPart::V));
    m_part->setToolTip(tr("Keys or values (K, V)"));
    for (HeatmapMetric m : {HeatmapMetric::RelLinf, HeatmapMetric::RelL2, HeatmapMetric::OneMinusCos,
                            HeatmapMetric::ErrorRatio, HeatmapMetric::BcVsNoise, HeatmapMetric::Bc})
        m_metric->addItem(QString::fromStdString(heatmapMetricShortName(m)), int(m));
    m_metric->setToolTip(tr("Metric (keys 1-6)"));
    m_reduction->addItem(tr("max over heads"), int(HeadReductionKind::Max));
    m_reduction->addItem(tr("mean over heads"), int(HeadReductionKind::Mean));
    m_reduction->addItem(tr("one head"), int(HeadReductionKind::OneHead));
    m_head->setPrefix(tr("head "));
    m_head->setEnabled(false);
    // Tab goes through what is chosen often (prompt, metric, part, heads); the range and its
    // log scale are set by click (each metric brings its own range).
    for (QWidget* w : std::initializer_list<QWidget*>{m_min, m_max, m_log})
        w->setFocusPolicy(Qt::ClickFocus);
    for (QDoubleSpinBox* box : {m_min, m_max}) {
        box->setDecimals(4);
        box->setRange(0, 1e9);
        box->setSingleStep(0.01);
        box->setKeyboardTracking(false);
        box->setMaximumWidth(90);
    }
    // At 1024 pixels the toolbar must keep Reset zoom in view: the prompt and the metric take
    // a fixed width, and their lists open as wide as their longest entry.
    m_prompt->setSizeAdjustPolicy(QComboBox::AdjustToMinimumContentsLengthWithIcon);
    m_prompt->setMinimumContentsLength(18);
    m_metric->setSizeAdjustPolicy(QComboBox::AdjustToMinimumContentsLengthWithIcon);
    m_metric->setMinimumContentsLength(11);
    m_reduction->setSizeAdjustPolicy(QComboBox::AdjustToMinimumContentsLengthWithIcon);
    m_reduction->setMinimumContentsLength(10);
    for (QComboBox* box : {m_prompt, m_metric, m_reduction})
        box->view()->setMinimumWidth(box->view()->sizeHintForColumn(0) + 24);
    m_auto->setToolTip(tr("Colour range from the data: up to twice the dtype noise's 99th percentile (errors), "
                          "0..1 (BC); the error in floors has a fixed scale, in units of the off threshold"));
    m_auto->setCheckable(true);
    m_auto->setChecked(true);
    addWidget(new QLabel(tr(" prompt ")));
    addWidget(m_prompt);
    addWidget(m_part);
    addWidget(m_metric);
    m_perHead = {addWidget(m_reduction), addWidget(m_head)};
    m_colourStart = addSeparator();
    addWidget(new QLabel(tr(" colour ")));
    addWidget(m_min);
    addWidget(new QLabel(" .. "));
    addWidget(m_max);
    addWidget(m_log);
    addWidget(m_auto);

    for (QComboBox* box : {m_prompt, m_part, m_reduction})
        connect(box, qOverload<int>(&QComboBox::currentIndexChanged), this, &ViewToolbar::emitChanged);
    connect(m_metric, qOverload<int>(&QComboBox::currentIndexChanged), this, [this] {
        m_autoRange = true;  // each metric has its own scale
        emitChanged();
    });
    connect(m_head, qOverload<int>(&QSpinBox::valueChanged), this, &ViewToolbar::emitChanged);
    for (QDoubleSpinBox* box : {m_min, m_max})
        connect(box, qOverload<double>(&QDoubleSpinBox::valueChanged), this, [this] {
            m_autoRange = false;  // the user's range stays until "auto range"
            emitChanged();
        });
    connect(m_log, &QCheckBox::toggled, this, &ViewToolbar::emitChanged);
    connect(m_auto, &QPushButton::clicked, this, [this] {
        m_autoRange = true;
        emitChanged();
    });
}

ViewSettings ViewToolbar::settings() const
{
    ViewSettings s;
    s.prompt = m_prompt->currentIndex();
    s.map.metric = HeatmapMetric(m_metric->currentData().toInt());
    s.map.part = KvPart(m_part->currentData().toInt());
    s.map.reduction = HeadReductionKind(m_reduction->currentData().toInt());
    s.map.head = m_head->value();
    s.range = {m_min->value(), std::max(m_max->value(), m_min->value() + 1e-9)};
    s.autoRange = m_autoRange;
    s.logarithmic = m_log->isChecked();
    return s;
}

void ViewToolbar::setPrompts(const QStringList& prompts, int heads, bool threeWay, const QStringList& parts,
                             const QString& bcVsNoiseOff)
{
    {
        const QSignalBlocker b1(m_prompt), b2(m_head), b3(m_metric), b4(m_reduction);
        m_prompt->clear();
        m_prompt->addItems(prompts);
        m_prompt->view()->setMinimumWidth(m_prompt->view()->sizeHintForColumn(0) + 24);  // (the list: whole names)
        for (int i = 0; i < 2 && i < parts.size(); ++i)
            m_part->setItemText(i, parts[i]);
        // One vector a token (an MLA latent): nothing to reduce over heads.
        if (heads == 1)
            m_reduction->setCurrentIndex(m_reduction->findData(int(HeadReductionKind::Max)));
        for (QAction* action : m_perHead)
            action->setVisible(heads != 1);
        m_head->setRange(0, std::max(0, heads - 1));
        // The BCs need an fp32 baseline, and the one against the noise floor values enough a
        // token: where they mean nothing they are off, and say why.
        for (HeatmapMetric m : {HeatmapMetric::BcVsNoise, HeatmapMetric::Bc})
            if (auto* item = qobject_cast<QStandardItemModel*>(m_metric->model())->item(m_metric->findData(int(m)))) {
                const QString off = !threeWay ? tr("needs an fp32 baseline (a three-way capture)")
                                    : m == HeatmapMetric::BcVsNoise ? bcVsNoiseOff
                                                                    : QString();
                item->setEnabled(off.isEmpty());
                item->setToolTip(off);
            }
        m_metric->setCurrentIndex(m_metric->findData(int(HeatmapMetric::ErrorRatio)));  // in floors, both ways
        m_autoRange = true;
    }
    emitChanged();
}

void ViewToolbar::setPrompt(int index)
{
    m_prompt->setCurrentIndex(index);
}

void ViewToolbar::stepPrompt(int delta)
{
    const int next = m_prompt->currentIndex() + delta;
    if (next >= 0 && next < m_prompt->count())
        m_prompt->setCurrentIndex(next);
}

void ViewToolbar::addViewAction(QAction* action)
{
    insertAction(m_colourStart, action);
    insertSeparator(m_colourStart);
}

void ViewToolbar::setMetric(HeatmapMetric metric)
{
    const int index = m_metric->findData(int(metric));
    if (const auto* item = qobject_cast<QStandardItemModel*>(m_metric->model())->item(index); item && !item->isEnabled())
        return;  // (a BC of a two-way capture: its keyboard shortcut does nothing either)
    m_metric->setCurrentIndex(index);
}

void ViewToolbar::setPart(KvPart part)
{
    m_part->setCurrentIndex(m_part->findData(int(part)));
}

void ViewToolbar::showRange(ValueRange range)
{
    const QSignalBlocker b1(m_min), b2(m_max);
    m_min->setValue(range.lower);
    m_max->setValue(range.upper);
}

void ViewToolbar::setAcrossPrompts(bool across)
{
    for (QWidget* w : std::initializer_list<QWidget*>{m_prompt, m_metric, m_reduction, m_min, m_max, m_log, m_auto})
        w->setEnabled(!across);
    m_head->setEnabled(!across && HeadReductionKind(m_reduction->currentData().toInt()) == HeadReductionKind::OneHead);
}

void ViewToolbar::emitChanged()
{
    m_auto->setChecked(m_autoRange);
    m_head->setEnabled(HeadReductionKind(m_reduction->currentData().toInt()) == HeadReductionKind::OneHead);
    emit settingsChanged(settings());
}

}  // namespace kvscope
