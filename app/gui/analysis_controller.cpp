#include "gui/analysis_controller.h"

#include "analysis/head_error_histogram.h"

#include "format/output_path.h"
#include "dumps/import_process.h"
#include "results/results_file.h"
#include "results/results_writer.h"

#include <QDir>
#include <QFileInfo>

#include <stdexcept>
#include <utility>

namespace kvscope {

AnalysisController::AnalysisController(QObject* parent)
    : QObject(parent)
    , m_tasks(this)
{
}

AnalysisController::~AnalysisController()
{
    *m_cancel = true;  // older runs were told at the next open()
    ++m_generation;
    // m_tasks, the last member, goes first: it waits for every run (they post to this object).
}

void AnalysisController::post(std::function<void()> fn, int generation)
{
    // Runs `fn` on the GUI thread, unless a newer open() has made it stale.
    m_tasks.post([this, fn = std::move(fn), generation] {
        if (generation == m_generation)
            fn();
    });
}

void AnalysisController::stopped()
{
    m_running = false;
    if (!m_keptPath.isEmpty())  // it never opened: the one on screen is current again
        m_path = std::exchange(m_keptPath, QString());
}

void AnalysisController::cancel()
{
    *m_cancel = true;
}

void AnalysisController::followMap(int prompt, const HeatmapSpec& spec)
{
    const std::lock_guard lock(m_followedMutex);
    m_followed = {prompt, spec};
}

namespace {

// Several bundles, or a folder holding bundles (a folder without is one of dumps).
bool isSweepOf(const QStringList& paths)
{
    return paths.size() > 1 ||
           (QFileInfo(paths.front()).isDir() && !QDir(paths.front()).entryList({"*.h5"}, QDir::Files).isEmpty());
}

}  // namespace

void AnalysisController::open(const QStringList& paths)
{
    OpenRun run;
    run.sweep = isSweepOf(paths);
    run.path = paths.size() > 1 ? tr("%1 and %2 more").arg(paths.front()).arg(paths.size() - 1) : paths.front();
    // The previous run stops at its next layer; its results are dropped (older generation).
    // Waiting for it here could freeze the window behind a long import.
    *m_cancel = true;
    m_cancel = std::make_shared<std::atomic<bool>>(false);
    run.cancel = m_cancel;
    run.generation = ++m_generation;
    // What is on screen stays until this one opens (a broken file must not take it away): a
    // finished analysis, or the one already kept while another was opening. An analysis still
    // running is dropped with its run.
    if (m_keptPath.isEmpty())
        m_keptPath = !m_running && m_result ? m_path : QString();
    if (m_keptPath.isEmpty()) {
        m_loader.reset();
        m_result.reset();
        m_ready.clear();
        m_resultsFile.clear();
    }
    m_path = run.path;
    m_running = true;
    if (QFileInfo(run.path).isDir() && !run.sweep)
        run.importDir = std::make_shared<QTemporaryDir>();
    for (const QString& p : paths)
        run.bundles.push_back(p.toStdString());
    run.layerHook = m_workerLayerHook;
    run.windowHook = m_workerWindowHook;
    run.windowTokens = m_windowTokens;
    run.probeHook = m_probeHook;
    m_tasks.run([this, run] { runOpen(run); });
}

void AnalysisController::runOpen(const OpenRun& run)
{
    const int generation = run.generation;
    bool wasOpened = false;  // failing later leaves no part of this bundle shown
    try {
        std::string bundle = run.path.toStdString();
        if (run.importDir) {
            post([this, path = run.path] { emit progress(0, 0, tr("importing %1").arg(path)); }, generation);
            bundle = QDir(run.importDir->path()).filePath("imported.h5").toStdString();
            runImport(run.path.toStdString(), bundle, run.cancel.get());  // a child process: cancel kills it
        }
        if (BundleReader::kProbeFromThreads && !run.sweep)  // a libhdf5 crash on this file must not take the app down
            BundleReader::probeInChild(bundle, run.probeHook);
        if (!run.sweep && isResultsFile(bundle))
            readResults(run, bundle, wasOpened);
        else
            analyse(run, bundle, wasOpened);
        post([this] {
            m_running = false;
            emit finished();
        }, generation);
    } catch (const ImportCancelled&) {
        post([this] {
            stopped();
            emit cancelled();
        }, generation);
    } catch (const AnalysisCancelled&) {
        post([this] {
            stopped();
            emit cancelled();
        }, generation);
    } catch (const std::exception& e) {
        const QString message = QString::fromStdString(e.what());
        post([this, message, wasOpened] {
            if (wasOpened) {
                m_loader.reset();
                m_result.reset();
                m_ready.clear();
                m_resultsFile.clear();
            }
            stopped();
            emit failed(message);
        }, generation);
    }
}

void AnalysisController::readResults(const OpenRun& run, const std::string& file, bool& wasOpened)
{
    // A saved analysis: its record and stored map at once (the map is read from the file as it
    // is shown), then its arrays a layer at a time, as an analysis would.
    const int generation = run.generation;
    auto results = std::make_shared<ResultsFile>(openResultsFile(file));
    auto loader = std::make_shared<const CaptureLoader>(results->bundle, results->options.unreadableBlocks);
    auto result = std::shared_ptr<AnalysisResult>(results, &results->result);
    const int layers = result->prompts.empty() ? 0 : int(result->prompts.front().layers.size());
    wasOpened = true;
    post([this, loader, result, layers, path = run.path, file, importDir = run.importDir, recorded = results->options] {
        m_recorded = recorded;
        m_keptPath.clear();
        m_loader = loader;  // the outline's, until the bundle is found
        m_result = result;
        m_ready.assign(std::size_t(layers), 0);
        m_importDir = importDir;
        m_bundleMissing = tr("looking for the bundle");
        m_resultsFile = QString::fromStdString(file);
        emit opened(path);
        emit progress(0, layers, tr("reading results"));
    }, generation);
    findResultsBundle(*results);
    auto found = std::make_shared<const CaptureLoader>(results->bundle, results->options.unreadableBlocks);
    post([this, found, missing = QString::fromStdString(results->bundleMissing)] {
        m_loader = found;
        m_bundleMissing = missing;
    }, generation);
    readResultsArrays(*results, [this, generation, layers, hook = run.layerHook](int layer) {
        if (hook)
            hook(layer + 1);
        post([this, layer, layers] {
            m_ready[std::size_t(layer)] = 1;
            emit layerFinished(layer);
            emit progress(layer + 1, layers, tr("reading results"));
        }, generation);
    }, run.cancel.get());
}

void AnalysisController::analyse(const OpenRun& run, const std::string& bundle, bool& wasOpened)
{
    const int generation = run.generation;
    AnalysisOptions options;
    options.windowTokens = run.windowTokens;
    std::shared_ptr<const CaptureLoader> loader;
    std::shared_ptr<AnalysisResult> result;
    if (run.sweep) {  // each bundle probed as it is opened; those that cannot be read are listed
        const Sweep opened = openSweep(run.bundles, options.unreadableBlocks, BundleReader::kProbeFromThreads
                                                                                ? BundleProbe([](const std::string& p) { BundleReader::probeInChild(p); })
                                                                                : BundleProbe());
        result = std::make_shared<AnalysisResult>(prepareAnalysis(opened, options));
        loader = opened.loader;
    } else {
        loader = std::make_shared<const CaptureLoader>(std::make_shared<BundleReader>(bundle), options.unreadableBlocks);
        result = std::make_shared<AnalysisResult>(prepareAnalysis(*loader, options));
    }
    const int layers = result->prompts.empty() ? 0 : int(result->prompts.front().layers.size());
    wasOpened = true;
    post([this, loader, result, layers, path = run.path, importDir = run.importDir, options] {
        m_keptPath.clear();
        m_loader = loader;
        m_result = result;
        m_ready.assign(std::size_t(layers), 0);
        m_importDir = importDir;  // the previous import's folder can go
        m_bundleMissing.clear();
        m_resultsFile.clear();
        m_recorded = recordedOptions(options);
        emit opened(path);
        emit progress(0, layers, tr("analysing"));
    }, generation);
    options.cancel = run.cancel.get();
    options.layerDone = [this, generation, hook = run.layerHook](int layer, int done, int total) {
        if (hook)
            hook(done);
        post([this, layer, done, total] {
            m_ready[std::size_t(layer)] = 1;
            emit layerFinished(layer);
            emit progress(done, total, tr("analysing"));
        }, generation);
    };
    options.windowDone = [this, generation, result, windowHook = run.windowHook](int layer, std::size_t first, std::size_t end,
                                                                               std::int64_t tokens) {
        showRowStart(generation, *result, layer, first, end, tokens);
        if (windowHook)
            windowHook(layer, tokens);
    };
    runAnalysis(*loader, options, *result);
}

void AnalysisController::showRowStart(int generation, const AnalysisResult& result, int layer, std::size_t first,
                                      std::size_t end, std::int64_t tokens)
{
    FollowedMap followed;
    {
        const std::lock_guard lock(m_followedMutex);
        followed = m_followed;
    }
    if (followed.prompt < 0 || std::size_t(followed.prompt) < first || std::size_t(followed.prompt) >= end)
        return;
    // (read now: nothing writes the cells during the call)
    auto row = std::make_shared<const HeatmapGrid>(
        heatmapRowStart(result.prompts[std::size_t(followed.prompt)], followed.spec, layer, tokens));
    post([this, layer, followed, row] { emit rowStarted(layer, followed.prompt, followed.spec, row); }, generation);
}

void AnalysisController::saveResults(const QString& file, std::function<void(const QString& error)> done)
{
    if (!m_loader || !m_result || m_running) {
        done(tr("no finished analysis to save"));
        return;
    }
    m_tasks.run([this, loader = m_loader, result = m_result, recorded = m_recorded, file, opened = m_path,
                 done = std::move(done)] {
        QString error;
        try {
            kvscope::requireWritableOutput(file.toStdString(), {opened.toStdString()});
            kvscope::saveResults(file.toStdString(), loader->outline(), *result, recorded);
        } catch (const std::exception& e) {
            error = QString::fromStdString(e.what());
        }
        m_tasks.post([error, done] { done(error); });
    });
}

void AnalysisController::requestHeadHistogram(const std::string& promptId, const std::string& layer, int head,
                                              KvPart part, qint64 begin, qint64 end, HistogramDone done)
{
    if (!m_loader) {
        done(nullptr, tr("no bundle is open"));
        return;
    }
    m_tasks.run([this, loader = m_loader, promptId, layer, head, part, begin, end, done = std::move(done),
                 generation = m_generation.load()] {
        std::shared_ptr<const HeadErrorHistogram> histogram;
        QString error;
        try {
            histogram = std::make_shared<const HeadErrorHistogram>(
                headErrorHistogram(*loader, promptId, layer, head, part, begin, end));
        } catch (const std::exception& e) {  // e.g. the file was truncated or replaced since it was opened
            error = QString::fromStdString(e.what());
        }
        post([histogram, error, done] { done(histogram, error); }, generation);
    });
}

}  // namespace kvscope
