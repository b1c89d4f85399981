#include "gui/analysis_controller.h"

#include "analysis/head_error_histogram.h"

#include "format/output_path.h"
#include "dumps/import_process.h"
#include "results/results_file.h"
#include "results/results_writer.h"
#include "util/child_process.h"
#include "util/sibling_executables.h"

#include <QDir>
#include <QFileInfo>

#include <stdexcept>
#include <utility>

namespace kvscope {

AnalysisController::AnalysisController(QObject* parent)
    : QObject(parent)
{
    connect(&m_door, &EngineDoor::progress, this, [this](const QString& tag, int done, int total, const QString& what) {
        if (tag == "open")  // (the import's; the analysis reports its layers itself)
            emit progress(done, total, what);
    });
}

AnalysisController::~AnalysisController() = default;  // m_door, the last member, goes first: it waits for every request

void AnalysisController::forget()
{
    m_loader.reset();
    m_result.reset();
    m_ready.clear();
    m_resultsFile.clear();
    m_results.reset();
}

void AnalysisController::stopped(const QString& error, bool wasOpened)
{
    m_running = false;
    const QString path = m_path;
    const bool opened = std::exchange(m_opened, false);
    if (!m_keptPath.isEmpty())  // it never opened: the one on screen is current again
        m_path = std::exchange(m_keptPath, QString());
    if (!error.isEmpty() && wasOpened)  // failing later leaves no part of this bundle shown
        forget();
    if (error.isEmpty() && opened)
        tell(&CaptureViewer::analysisCancelled);
    else if (m_result)
        tell(&CaptureViewer::openingStopped, path, error);
    else
        tell(&CaptureViewer::captureClosed, error.isEmpty()               ? tr("import of %1 cancelled").arg(path)
                                            : error.startsWith(path + ":") ? tr("could not open %1").arg(error)  // (it names the file)
                                                                           : tr("could not open %1: %2").arg(path, error));
}

void AnalysisController::cancel()
{
    m_door.cancel("open");
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
    openMade(paths, {}, {});
}

void AnalysisController::openMade(const QString& path, const std::vector<std::string>& makeArgv, const QString& making)
{
    openMade(QStringList{path}, makeArgv, making);
}

void AnalysisController::openMade(const QStringList& paths, const std::vector<std::string>& makeArgv, const QString& making)
{
    OpenRun run;
    run.makeArgv = makeArgv;
    run.making = making;
    run.sweep = isSweepOf(paths);
    run.path = paths.size() > 1 ? tr("%1 and %2 more").arg(paths.front()).arg(paths.size() - 1) : paths.front();
    // What is on screen stays until this one opens (a broken file must not take it away): a
    // finished analysis, or the one already kept while another was opening. An analysis still
    // running is dropped with its run (the door cancels it and drops what it still delivers).
    if (m_keptPath.isEmpty())
        m_keptPath = !m_running && m_result ? m_path : QString();
    if (m_keptPath.isEmpty())
        forget();
    m_path = run.path;
    m_inputs = paths;
    m_running = true;
    m_opened = false;
    if (QFileInfo(run.path).isDir() && !run.sweep)
        run.importDir = std::make_shared<QTemporaryDir>();
    for (const QString& p : paths)
        run.bundles.push_back(p.toStdString());
    run.hooks = m_hooks;
    m_door.drop("histogram");  // of the capture on screen
    tell(&CaptureViewer::captureOpening, run.path, !m_keptPath.isEmpty());
    m_door.ask("open", this, [this, run](EngineJob& job) { runOpen(run, job); });
}

void AnalysisController::runOpen(const OpenRun& run, const EngineJob& job)
{
    bool wasOpened = false;  // failing later leaves no part of this bundle shown
    try {
        std::string bundle = run.path.toStdString();
        if (!run.makeArgv.empty() && !QFileInfo::exists(run.path))
            makeBundle(run, job);
        if (run.importDir) {
            job.progress(0, 0, tr("importing %1").arg(run.path));
            bundle = QDir(run.importDir->path()).filePath("imported.h5").toStdString();
            runImport(run.path.toStdString(), bundle, job.cancelFlag());  // a child process: cancel kills it
        }
        if (BundleReader::kProbeFromThreads && !run.sweep)  // a libhdf5 crash on this file must not take the app down
            BundleReader::probeInChild(bundle, run.hooks.probe);
        if (!run.sweep && isResultsFile(bundle))
            readResults(run, job, bundle, wasOpened);
        else
            analyse(run, job, bundle, wasOpened);
        job.deliver([this] {
            m_running = false;
            m_opened = false;
            tell(&CaptureViewer::captureAnalysed);
            emit finished();
        });
    } catch (const ImportCancelled&) {
        job.deliver([this] {
            stopped({}, false);
            emit cancelled();
        });
    } catch (const AnalysisCancelled&) {
        job.deliver([this, wasOpened] {
            stopped({}, wasOpened);
            emit cancelled();
        });
    } catch (const std::exception& e) {
        const QString message = QString::fromStdString(e.what());
        job.deliver([this, message, wasOpened] {
            stopped(message, wasOpened);
            emit failed(message);
        });
    }
}

void AnalysisController::makeBundle(const OpenRun& run, const EngineJob& job)
{
    job.progress(0, 0, run.making);
    const ChildExit exit = runChildProcess(run.makeArgv, job.cancelFlag());
    if (exit.cancelled)
        throw ImportCancelled{};
    if (exit.signal != 0 || exit.exitCode != 0 || !QFileInfo::exists(run.path))
        throw std::runtime_error(tr("%1 could not be made: %2")
                                     .arg(run.path, exit.messages.empty() ? tr("no message") : QString::fromStdString(exit.messages))
                                     .toStdString());
}

void AnalysisController::locateBundle(const QString& bundle)
{
    if (!m_results || m_bundleMissing.isEmpty())
        return;
    // The record's header only (its arrays stay where they are, in the result on screen).
    auto header = std::make_shared<ResultsFile>();
    header->path = m_results->path;
    header->bundlePath = m_results->bundlePath;
    header->bundleFingerprint = m_results->bundleFingerprint;
    header->bundle = m_results->bundle;
    header->options = m_results->options;
    m_door.ask("locate", this, [this, header, bundle](EngineJob& job) {
        job.progress(0, 0, tr("checking %1").arg(bundle));
        findResultsBundle(*header, bundle.toStdString());
        auto found = std::make_shared<const CaptureLoader>(header->bundle, header->options.unreadableBlocks);
        job.deliver([this, found, header, bundle] {
            m_bundleMissing = QString::fromStdString(header->bundleMissing);
            if (m_bundleMissing.isEmpty())
                m_loader = found;
            emit bundleLocated();
        });
    });
}

void AnalysisController::readResults(const OpenRun& run, const EngineJob& job, const std::string& file, bool& wasOpened)
{
    // A saved analysis: its record and stored map at once (the map is read from the file as it
    // is shown), then its arrays a layer at a time, as an analysis would.
    auto results = std::make_shared<ResultsFile>(openResultsFile(file));
    auto loader = std::make_shared<const CaptureLoader>(results->bundle, results->options.unreadableBlocks);
    auto result = std::shared_ptr<AnalysisResult>(results, &results->result);
    const int layers = result->prompts.empty() ? 0 : int(result->prompts.front().layers.size());
    wasOpened = true;
    job.deliver([this, loader, result, layers, path = run.path, file, importDir = run.importDir, recorded = results->options] {
        m_recorded = recorded;
        m_bundleMissing = tr("looking for the bundle");
        m_resultsFile = QString::fromStdString(file);
        adopt(loader, result, layers, importDir);
        emit opened(path);
        emit progress(0, layers, tr("reading results"));
    });
    findResultsBundle(*results);
    auto found = std::make_shared<const CaptureLoader>(results->bundle, results->options.unreadableBlocks);
    job.deliver([this, found, results, missing = QString::fromStdString(results->bundleMissing)] {
        m_loader = found;
        m_bundleMissing = missing;
        m_results = results;
    });
    readResultsArrays(*results, [this, &job, layers, hook = run.hooks.layer](int layer) {
        if (hook)
            hook(layer + 1);
        job.deliver([this, layer, layers] {
            layerDone(layer);
            emit progress(layer + 1, layers, tr("reading results"));
        });
    }, job.cancelFlag());
}

void AnalysisController::analyse(const OpenRun& run, const EngineJob& job, const std::string& bundle, bool& wasOpened)
{
    AnalysisOptions options;
    options.windowTokens = run.hooks.windowTokens;
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
    job.deliver([this, loader, result, layers, path = run.path, importDir = run.importDir, options] {
        m_bundleMissing.clear();
        m_resultsFile.clear();
        m_results.reset();
        m_recorded = recordedOptions(options);
        adopt(loader, result, layers, importDir);
        emit opened(path);
        emit progress(0, layers, tr("analysing"));
    });
    options.cancel = job.cancelFlag();
    options.layerDone = [this, &job, hook = run.hooks.layer](int layer, int done, int total) {
        if (hook)
            hook(done);
        job.deliver([this, layer, done, total] {
            layerDone(layer);
            emit progress(done, total, tr("analysing"));
        });
    };
    options.windowDone = [this, &job, result, windowHook = run.hooks.window](int layer, std::size_t first, std::size_t end,
                                                                           std::int64_t tokens) {
        showRowStart(job, *result, layer, first, end, tokens);
        if (windowHook)
            windowHook(layer, tokens);
    };
    runAnalysis(*loader, options, *result);
}

void AnalysisController::adopt(std::shared_ptr<const CaptureLoader> loader, std::shared_ptr<AnalysisResult> result,
                                int layers, std::shared_ptr<QTemporaryDir> importDir)
{
    m_keptPath.clear();
    m_opened = true;
    m_loader = std::move(loader);
    m_result = std::move(result);
    m_ready.assign(std::size_t(layers), 0);
    m_importDir = std::move(importDir);  // the previous import's folder can go
    if (m_importDir)  // opened again (the report) as the bundle it was imported into
        m_inputs = {QDir(m_importDir->path()).filePath("imported.h5")};
    tell(&CaptureViewer::captureOpened);
}

void AnalysisController::layerDone(int layer)
{
    m_ready[std::size_t(layer)] = 1;
    tell(&CaptureViewer::layerAnalysed, layer);
    emit layerFinished(layer);
}

void AnalysisController::showRowStart(const EngineJob& job, const AnalysisResult& result, int layer, std::size_t first,
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
    job.deliver([this, layer, followed, row] { emit rowStarted(layer, followed.prompt, followed.spec, row); });
}

void AnalysisController::saveResults(const QString& file, std::function<void(const QString& error)> done)
{
    if (!m_loader || !m_result || m_running) {
        done(tr("no finished analysis to save"));
        return;
    }
    m_door.ask("save", this, [loader = m_loader, result = m_result, recorded = m_recorded, file, opened = m_path,
                              done = std::move(done)](EngineJob& job) {
        QString error;
        try {
            kvscope::requireWritableOutput(file.toStdString(), {opened.toStdString()});
            kvscope::saveResults(file.toStdString(), loader->outline(), *result, recorded);
        } catch (const std::exception& e) {
            error = QString::fromStdString(e.what());
        }
        job.deliver([error, done] { done(error); });
    });
}

void AnalysisController::writeReport(const QString& folder, bool withWhatIf,
                                     std::function<void(const QString& html, const QString& error)> done)
{
    if (!m_result || m_running) {
        done({}, tr("wait for the analysis to finish"));
        return;
    }
    std::vector<std::string> argv{siblingExecutable("kvscope-app", "KVSCOPE_APP"), "report"};
    for (const QString& input : std::as_const(m_inputs))
        argv.push_back(input.toStdString());
    argv.insert(argv.end(), {"-o", folder.toStdString()});
    if (!withWhatIf)
        argv.push_back("--no-whatif");
    m_door.ask("report", this, [argv, folder, done = std::move(done)](EngineJob& job) {
        job.progress(0, 0, tr("writing the report into %1").arg(folder));
        QString error;
        try {
            const ChildExit exit = runChildProcess(argv, job.cancelFlag());
            if (exit.cancelled)
                error = tr("cancelled");
            else if (exit.signal != 0)
                error = tr("the report crashed (signal %1): %2").arg(exit.signal).arg(QString::fromStdString(exit.messages));
            else if (exit.exitCode != 0)  // "kvscope report: <file: object: problem>"
                error = QString::fromStdString(exit.messages);
        } catch (const std::exception& e) {
            error = QString::fromStdString(e.what());
        }
        const QString html = error.isEmpty() ? QDir(folder).filePath("report.html") : QString();
        job.deliver([html, error, done] { done(html, error); });
    });
}

void AnalysisController::requestHeadHistogram(const std::string& promptId, const std::string& layer, int head,
                                              KvPart part, qint64 begin, qint64 end, HistogramDone done)
{
    if (!m_loader) {
        done(nullptr, tr("no bundle is open"));
        return;
    }
    // (a newer request replaces it: the drill-down shows one cell's at a time)
    m_door.ask("histogram", this, [loader = m_loader, promptId, layer, head, part, begin, end,
                                   done = std::move(done)](EngineJob& job) {
        std::shared_ptr<const HeadErrorHistogram> histogram;
        QString error;
        try {
            histogram = std::make_shared<const HeadErrorHistogram>(
                headErrorHistogram(*loader, promptId, layer, head, part, begin, end));
        } catch (const std::exception& e) {  // e.g. the file was truncated or replaced since it was opened
            error = QString::fromStdString(e.what());
        }
        job.deliver([histogram, error, done] { done(histogram, error); });
    });
}

void AnalysisController::requestStateHistogram(const std::string& promptId, const std::string& layer, qint64 position,
                                               const std::string& part, qint64 cell, HistogramDone done)
{
    if (!m_loader) {
        done(nullptr, tr("no bundle is open"));
        return;
    }
    m_door.ask("histogram", this, [loader = m_loader, promptId, layer, position, part, cell,
                                   done = std::move(done)](EngineJob& job) {
        std::shared_ptr<const HeadErrorHistogram> histogram;
        QString error;
        try {
            histogram = std::make_shared<const HeadErrorHistogram>(
                stateErrorHistogram(*loader, promptId, layer, position, part, cell));
        } catch (const std::exception& e) {
            error = QString::fromStdString(e.what());
        }
        job.deliver([histogram, error, done] { done(histogram, error); });
    });
}

}  // namespace kvscope
