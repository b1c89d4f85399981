#include "gui/whatif_page.h"

#include "analysis/heatmap_grid.h"
#include "analysis/map_spec.h"
#include "gui/analysis_controller.h"
#include "gui/map_box.h"
#include "quant/impact_recipe.h"
#include "report/report_writer.h"
#include "util/work_team.h"
#include "widgets/heatmap_view.h"

#include <QComboBox>
#include <QHBoxLayout>
#include <QHeaderView>
#include <QLabel>
#include <QPushButton>
#include <QScrollArea>
#include <QSplitter>
#include <QTableWidget>
#include <QVBoxLayout>

#include <algorithm>
#include <cmath>
#include <thread>

namespace kvscope {

namespace {

// A table cell that sorts by a number, not by its text.
class NumberItem : public QTableWidgetItem {
public:
    NumberItem(const QString& text, double key)
        : QTableWidgetItem(text)
    {
        setData(Qt::UserRole, key);
    }
    bool operator<(const QTableWidgetItem& other) const override
    {
        const double a = data(Qt::UserRole).toDouble(), b = other.data(Qt::UserRole).toDouble();
        return std::isnan(a) ? false : std::isnan(b) ? true : a < b;
    }
};

// The head whose error is worst in the layer, of the worse part (none: no head had an error).
QString worstHeadName(const WhatIfLayer& x)
{
    const int head = x.worstHead[x.worstHeadRelL2[1] > x.worstHeadRelL2[0] ? 1 : 0];
    return head < 0 ? QObject::tr("none") : QString::number(head);
}

}  // namespace

WhatIfPage::WhatIfPage(AnalysisController* controller, QWidget* parent)
    : QWidget(parent)
    , m_controller(controller)
    , m_run(new RunBar(tr("Run the what-if"), controller->door(), "whatif"))
    , m_verdicts(new QLabel)
    , m_table(new QTableWidget)
    , m_scheme(new QComboBox)
    , m_prompt(new QComboBox)
    , m_part(new QComboBox)
    , m_map(new HeatmapView)
{
    setObjectName("whatIf");
    m_run->button()->setObjectName("whatIfRun");
    m_table->setObjectName("whatIfTable");
    m_verdicts->setObjectName("whatIfVerdicts");
    m_verdicts->setWordWrap(true);
    m_verdicts->setAlignment(Qt::AlignTop | Qt::AlignLeft);
    m_verdicts->setTextInteractionFlags(Qt::TextSelectableByMouse);
    m_verdicts->setText(tr("What would an fp8, int8 or int4 KV cache cost this model? The what-if quantises the "
                           "reference KV with each scheme and measures the error it adds, in bf16 noise floors."));
    m_table->setEditTriggers(QAbstractItemView::NoEditTriggers);
    m_table->setSelectionBehavior(QAbstractItemView::SelectItems);
    m_table->verticalHeader()->hide();
    m_part->addItems({"K", "V"});
    // Verdicts, table and map share the height; the verdicts scroll when they do not fit.
    auto* verdicts = new QScrollArea;
    verdicts->setWidget(m_verdicts);
    verdicts->setWidgetResizable(true);
    verdicts->setFrameShape(QFrame::NoFrame);
    verdicts->setMinimumHeight(5 * fontMetrics().lineSpacing());  // (the floor line and a few verdicts)
    auto* split = new QSplitter(Qt::Vertical);
    split->addWidget(verdicts);
    split->addWidget(m_table);
    split->addWidget(mapBox({{m_scheme, 1}, {m_prompt, 1}, {m_part, 0}}, m_map));
    split->setStretchFactor(0, 1);
    split->setStretchFactor(1, 2);
    split->setStretchFactor(2, 2);
    auto* layout = new QVBoxLayout(this);
    layout->addWidget(m_run);
    layout->addWidget(split, 1);
    m_map->showEmpty(tr("Run the what-if to see a scheme's map"));

    connect(m_run->button(), &QPushButton::clicked, this, &WhatIfPage::start);
    connect(m_run, &RunBar::cancelledByUser, this, [this] { m_verdicts->setText(tr("Cancelled.")); });
    for (QComboBox* box : {m_scheme, m_prompt, m_part})
        connect(box, &QComboBox::currentIndexChanged, this, &WhatIfPage::showMap);
    // A click on a table cell shows that scheme's map.
    connect(m_table, &QTableWidget::cellClicked, this, [this](int, int column) {
        if (column >= 1 && column - 1 < m_scheme->count())
            m_scheme->setCurrentIndex(column - 1);
    });
}

void WhatIfPage::reset()
{
    m_run->drop(bool(m_controller->loader()));
    m_result.reset();
    m_table->clear();
    m_table->setRowCount(0);
    m_table->setColumnCount(0);
    m_scheme->clear();
    m_prompt->clear();
    m_map->showEmpty(tr("Run the what-if to see a scheme's map"));
    m_verdicts->setText(tr("What would an fp8, int8 or int4 KV cache cost this model? Run the what-if."));
}

QString WhatIfPage::unavailable() const
{
    if (!m_controller->loader())
        return tr("Open a capture first");
    if (!m_controller->bundleMissing().isEmpty())
        return tr("The what-if quantises the reference KV, which is in the bundle: %1").arg(m_controller->bundleMissing());
    return {};
}

void WhatIfPage::applyView(const ViewSettings& settings, bool)
{
    m_part->setCurrentIndex(settings.map.part == KvPart::V ? 1 : 0);
}

void WhatIfPage::start()
{
    const auto loader = m_controller->loader();
    if (!loader)
        return;
    m_verdicts->setText(tr("Quantising the reference KV with %1 schemes ...").arg(allSchemes().size()));
    m_run->run<WhatIfResult>(int(loader->config().layerNames().size()), [loader](const EngineJob& job) {
        WorkTeam team(int(std::max(1u, std::thread::hardware_concurrency())));
        WhatIfOptions options;
        options.schemes = allSchemes();
        options.team = &team;
        options.cancel = job.cancelFlag();
        options.progress = [&job](int done, int total) { job.progress(done, total); };
        return std::make_shared<const WhatIfResult>(runWhatIf(*loader, options));
    }, [this](std::shared_ptr<const WhatIfResult> result, const QString& error) { finished(std::move(result), error); });
}

void WhatIfPage::finished(std::shared_ptr<const WhatIfResult> result, const QString& error)
{
    m_result = std::move(result);
    if (!m_result) {
        m_verdicts->setText(error);
        return;
    }
    m_verdicts->setText(verdicts());
    fillTable();
    const QSignalBlocker a(m_scheme), b(m_prompt);
    m_scheme->clear();
    for (const WhatIfScheme& s : m_result->schemes)
        m_scheme->addItem(QString::fromStdString(s.scheme.name()));
    m_prompt->clear();
    for (const std::string& id : m_result->promptIds)
        m_prompt->addItem(QString::fromStdString(id));
    showMap();
}

void WhatIfPage::captureAnalysed()
{
    if (m_result)
        m_verdicts->setText(verdicts());
}

QString WhatIfPage::verdicts() const
{
    QStringList lines;
    lines << tr("Floor: %1 (median relative L2 K %2%, V %3%). Cells: K / V median error in floors, then the 90th "
                "percentile of the worse part, which colours the cell; hurt: a head does more than twice as badly as the "
                "model's typical worst head.")
                 .arg(m_result->floor == "baseline" ? tr("expected against the fp32 baseline") : tr("bf16 rounding of the values"))
                 .arg(100 * m_result->bf16FloorMedian[0], 0, 'g', 3)
                 .arg(100 * m_result->bf16FloorMedian[1], 0, 'g', 3);
    // By output first, where the bundle measured the schemes' impact (the analysis holds the
    // records, which its thread writes as it ends: read once it has).
    std::vector<const ImpactRecord*> records;
    const auto analysis = m_controller->isRunning() ? nullptr : m_controller->result();
    if (analysis)
        for (const PromptAnalysis& p : analysis->prompts)
            if (p.impact)
                records.push_back(&*p.impact);
    if (const std::optional<ImpactRecipe> recipe = recipeForMeasured(records, m_result->layers))
        lines << tr("<b>By output</b> (next-token KL with one layer's KV quantised, against bf16 noise there): %1")
                     .arg(QString::fromStdString(recipe->text).toHtmlEscaped());
    for (const WhatIfScheme& s : m_result->schemes)
        lines << QString("<b>%1</b>: %2").arg(QString::fromStdString(s.scheme.name()).toHtmlEscaped(),
                                              QString::fromStdString(s.verdict).toHtmlEscaped());
    return lines.join("<br>");
}

void WhatIfPage::fillTable()
{
    const WhatIfResult& r = *m_result;
    m_table->setSortingEnabled(false);
    m_table->clear();
    m_table->setRowCount(int(r.layers.size()));
    m_table->setColumnCount(int(r.schemes.size()) + 1);
    QStringList headers{tr("layer")};
    for (const WhatIfScheme& s : r.schemes)
        headers << QString::fromStdString(s.scheme.name());
    m_table->setHorizontalHeaderLabels(headers);
    const auto config = m_controller->loader()->config();
    for (int l = 0; l < int(r.layers.size()); ++l) {
        m_table->setItem(l, 0, new NumberItem(QString::fromStdString(layerRowLabel(config, r.layers[std::size_t(l)])), l));
        for (int s = 0; s < int(r.schemes.size()); ++s) {
            const WhatIfLayer& x = r.schemes[std::size_t(s)].layers[std::size_t(l)];
            auto* item = new NumberItem(whatIfCellText(x), whatIfCellLevel(x));
            item->setBackground(whatIfColour(whatIfCellLevel(x)));
            item->setForeground(Qt::black);
            item->setToolTip(tr("<b>%1</b>, %2<br>median relative L2: K %3%, V %4%<br>in bf16 floors: K %5, V %6<br>"
                                "worst head: %7 (%8%)<br>saturated: %9%<br>K outlier channels: %10x the median<br>"
                                "90th percentile in bf16 floors: K %11, V %12")
                                 .arg(QString::fromStdString(r.layers[std::size_t(l)]),
                                      QString::fromStdString(r.schemes[std::size_t(s)].scheme.description()))
                                 .arg(100 * x.relL2Median[0], 0, 'g', 3)
                                 .arg(100 * x.relL2Median[1], 0, 'g', 3)
                                 .arg(x.floorRatioMedian[0], 0, 'g', 3)
                                 .arg(x.floorRatioMedian[1], 0, 'g', 3)
                                 .arg(worstHeadName(x))
                                 .arg(100 * std::max(x.worstHeadRelL2[0], x.worstHeadRelL2[1]), 0, 'g', 3)
                                 .arg(100 * std::max(x.saturated[0], x.saturated[1]), 0, 'g', 3)
                                 .arg(x.kOutlierChannel, 0, 'g', 3)
                                 .arg(x.floorRatioP90[0], 0, 'g', 3)
                                 .arg(x.floorRatioP90[1], 0, 'g', 3));
            m_table->setItem(l, s + 1, item);
        }
    }
    m_table->setSortingEnabled(true);
    m_table->sortByColumn(0, Qt::AscendingOrder);
    m_table->resizeColumnsToContents();
}

void WhatIfPage::showMap()
{
    if (!m_result || m_scheme->currentIndex() < 0 || m_prompt->currentIndex() < 0)
        return;
    const WhatIfResult& r = *m_result;
    const WhatIfScheme& s = r.schemes[std::size_t(m_scheme->currentIndex())];
    const std::size_t prompt = std::size_t(m_prompt->currentIndex());
    const int part = m_part->currentIndex() == 1 ? 1 : 0;
    HeatmapGrid grid;
    grid.rows = int(r.layers.size());
    grid.columns = r.promptTokens[prompt];
    grid.values = s.maps[prompt][std::size_t(part)];
    grid.heads.assign(grid.values.size(), -1);
    MapSpec spec;
    spec.title = s.scheme.name() + ": " + (part ? "V" : "K") + " error in bf16 noise floors, worst head, prompt " +
                 r.promptIds[prompt];
    spec.metricLabel = "error in bf16 floors";
    spec.scale = ScaleKind::Error;
    float top = 0;
    for (float v : grid.values)
        if (std::isfinite(v))
            top = std::max(top, v);
    spec.range = {0.0, std::max(1.0, double(top))};
    const auto config = m_controller->loader()->config();
    for (const std::string& l : r.layers) {
        spec.rowLabels.push_back(layerRowLabel(config, l));
        spec.layerNames.push_back(l);
    }
    m_map->setGrid(grid);
    m_map->showMap(spec);
    m_map->resetView(grid.columns, grid.rows);
}

}  // namespace kvscope
