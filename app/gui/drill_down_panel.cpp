#include "gui/drill_down_panel.h"

#include "analysis/map_spec.h"
#include "format/bundle_reader.h"
#include "gui/head_table_model.h"
#include "kv/capture_loader.h"
#include "metrics/error_histogram.h"
#include "widgets/histogram_view.h"
#include "widgets/token_line_view.h"

#include <QCheckBox>
#include <QHBoxLayout>
#include <QHeaderView>
#include <QSortFilterProxyModel>
#include <QTableView>
#include <QVBoxLayout>
#include <QtConcurrent>

namespace kvscope {

DrillDownPanel::DrillDownPanel(QWidget* parent)
    : QSplitter(Qt::Horizontal, parent)
    , m_headModel(new HeadTableModel(this))
    , m_headProxy(new QSortFilterProxyModel(this))
    , m_headView(new QTableView)
    , m_histogram(new HistogramView)
    , m_logCounts(new QCheckBox(tr("log counts")))
    , m_wholeSequence(new QCheckBox(tr("all tokens of the layer")))
    , m_line(new TokenLineView)
    , m_watcher(new QFutureWatcher<std::shared_ptr<HeadErrorHistogram>>(this))
{
    m_headProxy->setSourceModel(m_headModel);
    m_headProxy->setSortRole(Qt::UserRole);
    m_headView->setModel(m_headProxy);
    m_headView->setSortingEnabled(true);
    m_headView->verticalHeader()->hide();
    m_headView->horizontalHeader()->setSectionResizeMode(QHeaderView::ResizeToContents);

    auto* histogramBox = new QWidget;
    auto* histogramLayout = new QVBoxLayout(histogramBox);
    histogramLayout->setContentsMargins(0, 0, 0, 0);
    auto* options = new QHBoxLayout;
    options->addWidget(m_logCounts);
    options->addWidget(m_wholeSequence);
    options->addStretch();
    histogramLayout->addLayout(options);
    histogramLayout->addWidget(m_histogram);

    addWidget(m_headView);
    addWidget(histogramBox);
    addWidget(m_line);
    setStretchFactor(0, 3);
    setStretchFactor(1, 2);
    setStretchFactor(2, 2);

    connect(m_logCounts, &QCheckBox::toggled, m_histogram, &HistogramView::setLogCounts);
    connect(m_wholeSequence, &QCheckBox::toggled, this, &DrillDownPanel::requestHistogram);
    connect(m_watcher, &QFutureWatcherBase::finished, this, [this] {
        if (m_watcher->future().resultCount() == 0)
            return;  // dropped: the selection changed since
        if (const auto h = m_watcher->result())
            m_histogram->setHistogram(*h, m_histogramTitle);
        else
            m_histogram->clearHistogram(tr("no histogram: the data could not be read"));
        emit histogramShown();
    });
}

void DrillDownPanel::clear(const QString& why)
{
    m_result.reset();
    m_layer = -1;
    m_headModel->clear();
    m_watcher->setFuture(QFuture<std::shared_ptr<HeadErrorHistogram>>());  // drop a pending histogram
    m_histogram->clearHistogram(why);
    m_line->clearSeries(why);
}

void DrillDownPanel::showCell(std::shared_ptr<const BundleReader> reader, std::shared_ptr<const AnalysisResult> result,
                              int promptIndex, const HeatmapSpec& spec, int layer, qint64 token)
{
    const PromptAnalysis& p = result->prompts[std::size_t(promptIndex)];
    m_headModel->setCell(result, promptIndex, layer, token);
    int head = -1;
    heatmapValue(p, spec, layer, token, &head);
    if (head < 0)
        head = spec.reduction == HeadReductionKind::OneHead ? spec.head : 0;
    m_reader = std::move(reader);
    m_result = std::move(result);
    m_prompt = promptIndex;
    m_layer = layer;
    m_token = token;
    m_head = head;
    m_part = spec.part;

    // The per-token line: the chosen metric of this layer and head across the sequence.
    const MetricKind kind = spec.metric == HeatmapMetric::RelL2 ? MetricKind::L2
                          : spec.metric == HeatmapMetric::OneMinusCos ? MetricKind::Cos : MetricKind::Linf;
    const Metric metric = metricFor(spec.part, kind);
    const auto shown = [&](float v) { return kind == MetricKind::Cos ? 1.0 - v : double(v); };
    QVector<double> actual, base;
    for (qint64 t = 0; t < p.tokens; ++t) {
        actual << shown(p.value(metric, layer, t, head));
        if (p.threeWay)
            base << shown(p.value(baseOf(metric), layer, t, head));
    }
    QVector<double> divergences;
    for (const Divergence& d : p.divergences)
        divergences << double(d.position);
    m_line->setSeries(actual, base,
                      QString("%1, head %2").arg(QString::fromStdString(shortLayerName(p.layers[std::size_t(layer)]))).arg(head),
                      QString("%1 %2").arg(kvPartName(spec.part), kind == MetricKind::Cos ? "1 - cos"
                                                                  : kind == MetricKind::L2 ? "rel. L2" : "rel. L-inf"),
                      double(p.promptLen) - 0.5, divergences, token);
    m_headView->selectRow(m_headProxy->mapFromSource(m_headModel->index(head, 0)).row());
    requestHistogram();
}

void DrillDownPanel::requestHistogram()
{
    if (!m_result || m_layer < 0 || !m_reader)
        return;
    const PromptAnalysis& p = m_result->prompts[std::size_t(m_prompt)];
    const bool whole = m_wholeSequence->isChecked();
    const qint64 begin = whole ? 0 : m_token, end = whole ? p.tokens : m_token + 1;
    m_histogramTitle = QString("%1 head %2 %3, %4")
                           .arg(QString::fromStdString(shortLayerName(p.layers[std::size_t(m_layer)])))
                           .arg(m_head)
                           .arg(kvPartName(m_part), whole ? tr("all tokens") : tr("token %1").arg(m_token));
    // Reading the bundle is work: off the GUI thread.
    auto reader = m_reader;
    const std::string id = p.id, layer = p.layers[std::size_t(m_layer)];
    const int head = m_head;
    const KvPart part = m_part;
    m_watcher->setFuture(QtConcurrent::run([reader, id, layer, head, part, begin, end] {
        try {
            const CaptureLoader loader(reader, UnreadableBlockPolicy::MarkAbsent);
            return std::make_shared<HeadErrorHistogram>(headErrorHistogram(loader, id, layer, head, part, begin, end));
        } catch (const std::exception&) {
            return std::shared_ptr<HeadErrorHistogram>();
        }
    }));
}

}  // namespace kvscope
