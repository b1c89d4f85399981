#include "gui/across_prompts_page.h"

#include "analysis/map_spec.h"
#include "gui/analysis_controller.h"
#include "widgets/bc_bar_view.h"
#include "widgets/heatmap_view.h"

#include <QToolTip>

#include <cmath>

namespace kvscope {

AcrossPromptsPage::AcrossPromptsPage(AnalysisController* controller, QWidget* parent)
    : QSplitter(Qt::Vertical, parent)
    , m_controller(controller)
    , m_map(new HeatmapView)
    , m_bars(new BcBarView)
{
    addWidget(m_map);
    addWidget(m_bars);
    setStretchFactor(0, 3);
    setStretchFactor(1, 1);
    setObjectName("acrossPrompts");
    connect(m_map, &HeatmapView::cellHovered, this, &AcrossPromptsPage::showTooltip);
    connect(m_map, &HeatmapView::cellClicked, this, &AcrossPromptsPage::cellChosen);
}

void AcrossPromptsPage::applyView(const ViewSettings& settings, bool)
{
    if (settings.map.part == m_part)
        return;
    m_part = settings.map.part;
    if (!m_controller->isRunning())
        refresh();
}

QString AcrossPromptsPage::unavailable() const
{
    const auto result = m_controller->result();
    if (m_drawn)
        return {};
    if (!result)
        return tr("Open a capture first");
    if (m_controller->isRunning())
        return tr("Across prompts pools every prompt: it is shown when the analysis has finished");
    if (!result->aggregate)
        return tr("Across prompts pools the BC of three-way prompts (those with an fp32 baseline); this capture has none");
    return tr("The analysis was cancelled: across prompts needs every layer");
}

bool AcrossPromptsPage::refresh()
{
    const auto result = m_controller->result();
    if (!result || !result->aggregate)
        return false;
    const AggregateBc& a = *result->aggregate;
    m_map->setGrid(aggregateHeatmap(*result, m_part));
    m_map->showMap(acrossPromptsMapSpec(m_controller->loader()->config(), *result, m_part));
    m_map->resetView(a.generationCount, int(a.layers.size()));
    QStringList rows;
    for (const std::string& l : a.layers)
        rows << QString::fromStdString(layerRowLabel(m_controller->loader()->config(), l));
    // BC against the noise floor: the reference tool's BC reads ~1 on real faults.
    QVector<double> k(a.combinedVsNoise[0].begin(), a.combinedVsNoise[0].end()),
        v(a.combinedVsNoise[1].begin(), a.combinedVsNoise[1].end());
    QStringList parts{"K", "V"};
    if (!result->prompts.empty())
        parts = {QString::fromStdString(partTitle(result->prompts.front(), KvPart::K)),
                 QString::fromStdString(partTitle(result->prompts.front(), KvPart::V))};
    m_bars->setValues(rows, k, v, parts);
    return true;
}

void AcrossPromptsPage::showTooltip(int row, qint64 g, const QPoint& globalPos)
{
    const auto result = m_controller->result();
    if (!result || !result->aggregate || m_controller->isRunning())
        return;
    const AggregateBc& a = *result->aggregate;
    if (row < 0 || row >= int(a.layers.size()) || g < 0 || g >= a.generationCount)
        return;
    // (the map's value: none where an index pools too few values for a BC)
    const float bc = m_map->grid().at(row, g);
    QToolTip::showText(globalPos,
                       QString("<b>%1</b><br>generation index %2<br>%3 BC vs noise: %4<br>divergences here: %5/%6<br><i>click: the prompt where it is worst</i>")
                           .arg(QString::fromStdString(a.layers[std::size_t(row)]))
                           .arg(g)
                           .arg(QString::fromStdString(result->prompts.empty() ? kvPartName(m_part) : partName(result->prompts.front(), m_part)),
                                !generationBcMeaningful(*result) ? tr("not drawn: too few values")
                                : std::isnan(bc)                   ? tr("no data")
                                                                   : QString::number(bc, 'f', 4))
                           .arg(a.divergenceCounts[std::size_t(g)])
                           .arg(a.promptIds.size()),
                       m_map);
}

}  // namespace kvscope
