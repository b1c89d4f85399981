#include "gui/compare_page.h"

#include "analysis/map_spec.h"
#include "diff/diff_maps.h"
#include "diff/diff_side.h"
#include "gui/analysis_controller.h"
#include "gui/map_box.h"
#include "gui/transfer_view.h"
#include "widgets/heatmap_view.h"
#include "widgets/token_line_view.h"

#include <QComboBox>
#include <QFileDialog>
#include <QFileInfo>
#include <QHeaderView>
#include <QLabel>
#include <QPushButton>
#include <QSplitter>
#include <QStackedWidget>
#include <QTableWidget>
#include <QToolTip>
#include <QVBoxLayout>

#include <cmath>

namespace kvscope {

namespace {

QString floorsText(double x)
{
    return std::isfinite(x) ? QString::number(x, 'g', x < 10 ? 2 : 3) : QObject::tr("no data");
}

}  // namespace

ComparePage::ComparePage(AnalysisController* controller, QWidget* parent)
    : QWidget(parent)
    , m_controller(controller)
    , m_mode(new QComboBox)
    , m_run(new RunBar(tr("Compare with..."), controller->door(), "compare"))
    , m_views(new QStackedWidget)
    , m_transferView(new TransferView)
    , m_summary(new QLabel)
    , m_table(new QTableWidget)
    , m_prompt(new QComboBox)
    , m_part(new QComboBox)
    , m_kind(new QComboBox)
    , m_map(new HeatmapView)
    , m_cell(new QLabel)
    , m_line(new TokenLineView)
{
    setObjectName("compare");
    m_run->button()->setObjectName("compareChoose");
    m_table->setObjectName("compareTable");
    m_summary->setWordWrap(true);
    m_summary->setTextInteractionFlags(Qt::TextSelectableByMouse);
    m_cell->setWordWrap(true);
    m_cell->setTextInteractionFlags(Qt::TextSelectableByMouse);
    m_table->setEditTriggers(QAbstractItemView::NoEditTriggers);
    m_table->setSelectionBehavior(QAbstractItemView::SelectRows);
    m_table->setSelectionMode(QAbstractItemView::SingleSelection);
    m_table->verticalHeader()->hide();
    m_kind->addItems({tr("B - A"), tr("A"), tr("B")});
    m_part->addItems({"K", "V"});
    m_line->setSeriesNames("B", "A");
    // The cell, A and B side by side: the numbers, then the layer across the tokens.
    auto* cellBox = new QWidget;
    auto* cellLayout = new QVBoxLayout(cellBox);
    cellLayout->setContentsMargins(0, 0, 0, 0);
    cellLayout->addWidget(m_cell);
    cellLayout->addWidget(m_line, 1);
    auto* lower = new QSplitter(Qt::Horizontal);
    lower->addWidget(m_table);
    lower->addWidget(cellBox);
    lower->setStretchFactor(0, 2);
    lower->setStretchFactor(1, 3);
    auto* split = new QSplitter(Qt::Vertical);
    split->addWidget(mapBox({{m_kind, 0}, {m_prompt, 1}, {m_part, 0}}, m_map));
    split->addWidget(lower);
    split->setStretchFactor(0, 1);
    split->setStretchFactor(1, 1);
    auto* regressions = new QWidget;
    auto* regressionsLayout = new QVBoxLayout(regressions);
    regressionsLayout->setContentsMargins(0, 0, 0, 0);
    regressionsLayout->addWidget(m_summary);
    regressionsLayout->addWidget(split, 1);
    m_views->addWidget(regressions);
    m_views->addWidget(m_transferView);
    m_mode->setObjectName("compareMode");
    m_mode->addItems({tr("Regressions: is the open capture (B) worse than A?"),
                      tr("Transfer: did the open capture (consumer) get the producer's KV?")});
    m_mode->setToolTip(tr("Regressions compares two captures against the same reference (kvscope diff); transfer "
                          "compares a consumer's KV with its producer's, bit for bit, without a reference (kvscope transfer)"));
    auto* top = new QHBoxLayout;
    top->addWidget(m_mode);
    top->addWidget(m_run, 1);
    auto* layout = new QVBoxLayout(this);
    layout->addLayout(top);
    layout->addWidget(m_views, 1);
    reset();
    connect(m_mode, &QComboBox::currentIndexChanged, this, [this](int index) {
        m_views->setCurrentIndex(index);
        m_run->button()->setText(index == 1 ? tr("Compare with the producer...") : tr("Compare with..."));
    });

    connect(m_run, &RunBar::cancelledByUser, this, [this] { m_summary->setText(tr("Cancelled.")); });
    connect(m_run->button(), &QPushButton::clicked, this, &ComparePage::chooseA);
    for (QComboBox* box : {m_kind, m_prompt, m_part})
        connect(box, &QComboBox::currentIndexChanged, this, &ComparePage::showMap);
    connect(m_map, &HeatmapView::cellClicked, this, &ComparePage::showCell);
    connect(m_map, &HeatmapView::cellHovered, this, [this](int row, qint64 token, const QPoint& at) {
        if (!m_result || m_prompt->currentIndex() < 0 || row < 0)
            return QToolTip::hideText();
        const DiffPromptMaps& maps = m_result->maps[std::size_t(m_prompt->currentIndex())];
        const std::size_t part = m_part->currentIndex() == 1 ? 1 : 0;
        if (token < 0 || token >= maps.tokens || std::size_t(row) >= m_result->layerNamesB.size())
            return QToolTip::hideText();
        const std::size_t i = std::size_t(row) * std::size_t(maps.tokens) + std::size_t(token);
        const double a = maps.ratiosA[part][i], b = maps.ratiosB[part][i];
        QToolTip::showText(at, tr("%1, token %2<br>A %3 | B %4 | B - A %5 floors")
                                   .arg(QString::fromStdString(m_result->layerNamesB[std::size_t(row)]))
                                   .arg(token)
                                   .arg(floorsText(a), floorsText(b),
                                        floorsText(std::isfinite(a) && std::isfinite(b) ? b - a : std::nan(""))),
                           m_map);
    });
    // A layer of the table: its first worse cell, or the layer's first token.
    connect(m_table, &QTableWidget::cellClicked, this, [this](int row, int) {
        if (!m_result)
            return;
        const int layer = m_table->item(row, 0)->data(Qt::UserRole).toInt();
        const LayerDiff* diff = nullptr;
        for (const LayerDiff& l : m_result->layers)
            if (l.layer == layer)
                diff = &l;
        qint64 token = 0;
        if (diff && diff->firstWorse) {
            for (std::size_t m = 0; m < m_result->maps.size(); ++m)
                if (m_result->maps[m].b == diff->firstWorse->prompt)
                    m_prompt->setCurrentIndex(int(m));
            m_part->setCurrentIndex(int(diff->firstWorse->part));
            token = diff->firstWorse->token;
        }
        m_map->setSelection(layer, token);
        m_map->ensureVisible(layer, token);
        showCell(layer, token);
    });
}

void ComparePage::reset()
{
    m_run->drop(bool(m_controller->result()) && !m_controller->isRunning());
    m_result.reset();
    m_table->clear();
    m_table->setRowCount(0);
    m_table->setColumnCount(0);
    m_prompt->clear();
    m_map->showEmpty(tr("File > Compare with... to see B - A"));
    m_line->clearSeries(tr("Click a cell to see A and B side by side"));
    m_cell->clear();
    m_summary->setText(tr("Is the open capture (B) worse than another capture of the same prompts (A: before an engine "
                          "change, or another engine)? Compare with A's bundle, or with its analysis JSON."));
    // An engine-only capture has no analysis of its own to compare: it is one end of a transfer.
    if (const auto loader = m_controller->loader(); loader && loader->metadata().engineOnly)
        setMode(Mode::Transfer);
    m_transferView->clear(tr("Did the open capture, taken where a KV transfer arrived (the consumer: a decode instance, the "
                             "side that loads from an offload store), get exactly what the producer sent? Compare with the "
                             "producer's capture of the same requests. No reference is needed."));
}

HeatmapView& ComparePage::exportedMap()
{
    return mode() == Mode::Transfer ? m_transferView->heatmap() : *m_map;
}

void ComparePage::setMode(Mode mode)
{
    m_mode->setCurrentIndex(mode == Mode::Transfer ? 1 : 0);
}

ComparePage::Mode ComparePage::mode() const
{
    return m_mode->currentIndex() == 1 ? Mode::Transfer : Mode::Regressions;
}

QString ComparePage::unavailable() const
{
    if (!m_controller->result())
        return tr("Open a capture first");
    if (m_controller->isRunning())
        return tr("Compare needs the finished analysis of the open capture (B)");
    if (!m_controller->bundleMissing().isEmpty())
        return tr("Compare needs the KV of the open capture: %1").arg(m_controller->bundleMissing());
    if (m_controller->loader() && m_controller->loader()->isSweep())
        return tr("A sweep is compared bundle by bundle: kvscope diff A B");
    return {};
}

void ComparePage::applyView(const ViewSettings& settings, bool)
{
    m_part->setCurrentIndex(settings.map.part == KvPart::V ? 1 : 0);
}

void ComparePage::chooseA()
{
    if (mode() == Mode::Transfer) {
        const QString path = QFileDialog::getOpenFileName(this, tr("Compare with the producer (where the KV was sent from)"),
                                                          QFileInfo(m_controller->path()).absolutePath(),
                                                          tr("Captures (*.h5 *.hdf5);;All files (*)"));
        if (!path.isEmpty())
            compareTransferWith(path);
        return;
    }
    // Beside the open bundle: A is usually the capture made before the change, next to it.
    const QString path = QFileDialog::getOpenFileName(this, tr("Compare with (A: before the change)"),
                                                      QFileInfo(m_controller->path()).absolutePath(),
                                                      tr("Captures and analyses (*.h5 *.hdf5 *.kvres *.json);;All files (*)"));
    if (!path.isEmpty())
        compareWith(path);
}

void ComparePage::compareWith(const QString& pathA)
{
    const auto loader = m_controller->loader();
    const auto b = m_controller->result();
    if (!loader || !b || m_controller->isRunning())
        return;
    m_summary->setText(tr("Comparing with %1 ...").arg(QFileInfo(pathA).fileName()));
    const std::string path = pathA.toStdString();
    m_run->run<DiffResult>(0, [loader, b, path](const EngineJob& job) -> std::shared_ptr<const DiffResult> {
        AnalysisOptions options;  // as kvscope diff analyses A
        options.searchSuspects = false;
        options.bcs.reset();
        options.cancel = job.cancelFlag();
        options.layerDone = [&job](int, int done, int total) { job.progress(done, total); };
        const DiffSide a = loadDiffSide(path, options);
        return std::make_shared<const DiffResult>(diffAnalyses(a, *b, *loader, {}));
    }, [this](std::shared_ptr<const DiffResult> result, const QString& error) { finished(std::move(result), error); });
}

void ComparePage::compareTransferWith(const QString& producerPath)
{
    if (!m_controller->loader() || m_controller->isRunning())
        return;
    setMode(Mode::Transfer);
    m_transferView->clear(tr("Comparing with the producer %1 ...").arg(QFileInfo(producerPath).fileName()));
    const std::string producer = producerPath.toStdString(), consumer = m_controller->path().toStdString();
    m_run->run<TransferResult>(
        1000,
        [producer, consumer](const EngineJob& job) -> std::shared_ptr<const TransferResult> {
            TransferOptions options;
            options.cancel = job.cancelFlag();
            options.progress = [&job](std::size_t done, std::size_t total) { job.progress(int(1000 * done / std::max<std::size_t>(total, 1)), 1000); };
            options.listedBlocks = 100000;  // the map shows every listed block
            return std::make_shared<const TransferResult>(compareTransfer(producer, consumer, options));
        },
        [this](std::shared_ptr<const TransferResult> result, const QString& error) {
            if (result)
                m_transferView->show(std::move(result));
            else
                m_transferView->clear(tr("Could not compare: %1").arg(error.toHtmlEscaped()));
            emit comparisonFinished();
        });
}

void ComparePage::finished(std::shared_ptr<const DiffResult> result, const QString& error)
{
    m_result = std::move(result);
    if (!m_result) {
        m_summary->setText(tr("Could not compare: %1").arg(error.toHtmlEscaped()));
        emit comparisonFinished();
        return;
    }
    const DiffResult& d = *m_result;
    const int worse = d.count(Change::Worse), better = d.count(Change::Better);
    QString text = tr("A: %1%2. %3 prompt(s) matched by their tokens, the same reference (fingerprints)")
                       .arg(QString::fromStdString(d.pathA).toHtmlEscaped(), d.aFromAnalysisJson ? tr(" (analysis)") : QString())
                       .arg(d.matched.size());
    if (!d.onlyA.empty() || !d.onlyB.empty())
        text += tr("; not matched: %1 of A, %2 of B").arg(d.onlyA.size()).arg(d.onlyB.size());
    text += tr(". Per layer the %1 of the cells' error ratio in floors; worse: above noise and more than %2x A's.<br>")
                .arg(diffStatName(d.options.stat))
                .arg(d.options.maxWorse);
    text += worse ? tr("<b style='color:#b2182b'>B is worse in %1 layer(s)</b>").arg(worse)
                  : better ? tr("<b>B is no worse, and better in %1 layer(s)</b>").arg(better) : tr("<b>B is no worse</b>");
    if (d.firstWorse && d.firstWorse->token >= 0)
        text += tr("; first at %1, token %2 of %3 (%4: %5 -> %6 floors)")
                    .arg(QString::fromStdString(d.layerNamesB[std::size_t(d.firstWorse->layer)]))
                    .arg(d.firstWorse->token)
                    .arg(QString::fromStdString(d.firstWorse->prompt))
                    .arg(QString::fromStdString(d.partNames[std::size_t(d.firstWorse->part)]))
                    .arg(floorsText(d.firstWorse->a), floorsText(d.firstWorse->b));
    for (const Suspect& s : d.suspects)
        text += tr("<br>Suspect of the change: <b>%1</b> (%2 floors): %3")
                    .arg(suspectPatternName(s.pattern))
                    .arg(floorsText(s.score), QString::fromStdString(s.evidence).toHtmlEscaped());
    m_summary->setText(text);
    const QSignalBlocker blockPrompt(m_prompt), blockPart(m_part);
    m_prompt->clear();
    for (const DiffPromptMaps& m : d.maps)
        m_prompt->addItem(QString::fromStdString(m.b == m.a ? m.b : m.b + " = A's " + m.a));
    m_part->setItemText(0, QString::fromStdString(d.partNames[0]));
    m_part->setItemText(1, QString::fromStdString(d.partNames[1]));
    fillTable();
    showMap();
    if (m_table->rowCount() > 0 && d.verdict() == Change::Worse)
        emit m_table->cellClicked(0, 0);  // the first regression's first worse cell
    emit comparisonFinished();
}

void ComparePage::fillTable()
{
    const DiffResult& d = *m_result;
    m_table->clear();
    // The verdict's own numbers beside it: the statistic it is taken from, and the level it must pass.
    const QString stat = QString::fromStdString(diffStatName(d.options.stat));
    m_table->setColumnCount(6);
    m_table->setHorizontalHeaderLabels({tr("layer"), tr("change"), QString::fromStdString(d.partNames[0]) + tr(": A -> B (%1)").arg(stat),
                                        QString::fromStdString(d.partNames[1]) + tr(": A -> B (%1)").arg(stat), tr("noise level"),
                                        tr("cells worse")});
    // The regressions first, then what got better, then the rest; model order within each.
    std::vector<const LayerDiff*> rows;
    for (Change change : {Change::Worse, Change::Better, Change::Same})
        for (const LayerDiff& l : d.layers)
            if (l.verdict() == change)
                rows.push_back(&l);
    m_table->setRowCount(int(rows.size()));
    for (int r = 0; r < int(rows.size()); ++r) {
        const LayerDiff& l = *rows[std::size_t(r)];
        auto* name = new QTableWidgetItem(QString::fromStdString(shortLayerName(l.name)));  // as the map's rows
        name->setData(Qt::UserRole, l.layer);
        name->setToolTip(QString::fromStdString(l.name));
        m_table->setItem(r, 0, name);
        auto* change = new QTableWidgetItem(changeName(l.verdict()));
        const double level = std::max(l.noise[0], l.noise[1]);
        change->setToolTip(tr("worse: B's %1 above the noise level (%2 floors) and more than %3x A's; better: the same "
                              "with A and B exchanged; else same")
                               .arg(stat, floorsText(level))
                               .arg(d.options.maxWorse));
        m_table->setItem(r, 1, change);
        for (int p = 0; p < 2; ++p)
            m_table->setItem(r, 2 + p, new QTableWidgetItem(floorsText(l.statA[std::size_t(p)]) + " -> " +
                                                            floorsText(l.statB[std::size_t(p)])));
        m_table->setItem(r, 4, new QTableWidgetItem(floorsText(std::max(l.noise[0], l.noise[1]))));
        m_table->setItem(r, 5, new QTableWidgetItem(QString::number(l.worseCells[0] + l.worseCells[1])));
        const QColor tint = l.verdict() == Change::Worse ? QColor(244, 165, 130) : l.verdict() == Change::Better ? QColor(146, 197, 222) : QColor();
        if (tint.isValid())
            for (int c = 0; c < 6; ++c) {
                m_table->item(r, c)->setBackground(tint);
                m_table->item(r, c)->setForeground(Qt::black);
            }
    }
    m_table->resizeColumnsToContents();
}

void ComparePage::showMap()
{
    if (!m_result || m_prompt->currentIndex() < 0)
        return;
    const DiffResult& d = *m_result;
    const std::size_t m = std::size_t(m_prompt->currentIndex());
    const KvPart part = m_part->currentIndex() == 1 ? KvPart::V : KvPart::K;
    const DiffMapKind kind = m_kind->currentIndex() == 1 ? DiffMapKind::A : m_kind->currentIndex() == 2 ? DiffMapKind::B
                                                                                                          : DiffMapKind::Change;
    const auto b = m_controller->result();
    const auto loader = m_controller->loader();
    const std::string& id = d.maps[m].b;
    const PromptAnalysis* prompt = nullptr;
    for (const PromptAnalysis& p : b->prompts)
        if (p.id == id)
            prompt = &p;
    if (!prompt)
        return;
    const HeatmapGrid grid = diffHeatmap(d, m, part, kind);
    m_map->setGrid(grid);
    m_map->showMap(diffMapSpec(loader->config(), d, m, part, kind, *prompt, loader->prompt(id)));
    m_map->resetView(grid.columns, grid.rows);
}

void ComparePage::showCell(int row, qint64 token)
{
    if (!m_result || m_prompt->currentIndex() < 0 || row < 0)
        return;
    const DiffResult& d = *m_result;
    const DiffPromptMaps& maps = d.maps[std::size_t(m_prompt->currentIndex())];
    const std::size_t part = m_part->currentIndex() == 1 ? 1 : 0;
    if (token < 0 || token >= maps.tokens || std::size_t(row) >= d.layerNamesB.size())
        return;
    m_map->setSelection(row, token);
    const std::size_t at = std::size_t(row) * std::size_t(maps.tokens) + std::size_t(token);
    const double a = maps.ratiosA[part][at], b = maps.ratiosB[part][at];
    const QString layer = QString::fromStdString(d.layerNamesB[std::size_t(row)]);
    const QString partName = QString::fromStdString(d.partNames[part]);
    m_cell->setText(tr("<b>%1, token %2</b> of %3, %4 (error ratio in floors, largest head):<br>"
                       "A <b>%5</b> &nbsp;|&nbsp; B <b>%6</b> &nbsp;|&nbsp; B - A <b>%7</b>")
                        .arg(layer.toHtmlEscaped())
                        .arg(token)
                        .arg(QString::fromStdString(maps.b).toHtmlEscaped(), partName)
                        .arg(floorsText(a), floorsText(b), floorsText(std::isfinite(a) && std::isfinite(b) ? b - a : std::nan(""))));
    QVector<double> seriesA, seriesB;
    for (qint64 t = 0; t < maps.tokens; ++t) {
        const std::size_t i = std::size_t(row) * std::size_t(maps.tokens) + std::size_t(t);
        seriesA.append(maps.ratiosA[part][i]);
        seriesB.append(maps.ratiosB[part][i]);
    }
    const auto result = m_controller->result();
    double prefill = std::nan("");
    for (const PromptAnalysis& p : result->prompts)
        if (p.id == maps.b)
            prefill = double(p.promptLen) - 0.5;
    m_line->setSeries(seriesB, seriesA, layer + ", " + partName + ": A and B across the tokens", tr("floors"), prefill, {},
                      token);
}

}  // namespace kvscope
