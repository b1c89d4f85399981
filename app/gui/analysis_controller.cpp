#include "gui/analysis_controller.h"

#include "import/import_process.h"

#include <QDir>
#include <QFileInfo>

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

void AnalysisController::cancel()
{
    *m_cancel = true;
}

void AnalysisController::open(const QString& path)
{
    // The previous run stops at its next layer; its results are dropped (older generation).
    // Waiting for it here could freeze the window behind a long import.
    *m_cancel = true;
    m_cancel = std::make_shared<std::atomic<bool>>(false);
    auto cancel = m_cancel;
    const int generation = ++m_generation;
    m_path = path;
    m_running = true;
    m_reader.reset();
    m_result.reset();
    m_ready.clear();
    std::shared_ptr<QTemporaryDir> importDir;
    if (QFileInfo(path).isDir())
        importDir = std::make_shared<QTemporaryDir>();
    m_tasks.run([this, path, generation, importDir, cancel, hook = m_workerLayerHook, probeHook = m_probeHook] {
        try {
            std::string bundle = path.toStdString();
            if (importDir) {
                post([this, path, generation] { emit progress(0, 0, tr("importing %1").arg(path)); }, generation);
                bundle = QDir(importDir->path()).filePath("imported.h5").toStdString();
                runImport(path.toStdString(), bundle, cancel.get());  // a child process: cancel kills it
            }
            if (BundleReader::kProbeFromThreads)  // a libhdf5 crash on this file must not take the app down
                BundleReader::probeInChild(bundle, probeHook);
            auto reader = std::make_shared<BundleReader>(bundle);
            AnalysisOptions options;
            auto result = std::make_shared<AnalysisResult>(prepareAnalysis(*reader, options));
            const int layers = result->prompts.empty() ? 0 : int(result->prompts.front().layers.size());
            post([this, reader, result, layers, path, importDir] {
                m_reader = reader;
                m_result = result;
                m_ready.assign(std::size_t(layers), 0);
                m_importDir = importDir;  // the previous import's folder can go
                emit opened(path);
                emit progress(0, layers, tr("analysing"));
            }, generation);
            options.cancel = cancel.get();
            options.layerDone = [this, generation, hook](int layer, int done, int total) {
                if (hook)
                    hook(done);
                post([this, layer, done, total] {
                    m_ready[std::size_t(layer)] = 1;
                    emit layerFinished(layer);
                    emit progress(done, total, tr("analysing"));
                }, generation);
            };
            runAnalysis(reader, options, *result);
            post([this] {
                m_running = false;
                emit finished();
            }, generation);
        } catch (const ImportCancelled&) {
            post([this] {
                m_running = false;
                emit cancelled();
            }, generation);
        } catch (const AnalysisCancelled&) {
            post([this] {
                m_running = false;
                emit cancelled();
            }, generation);
        } catch (const std::exception& e) {
            const QString message = QString::fromStdString(e.what());
            post([this, message] {
                m_running = false;
                emit failed(message);
            }, generation);
        }
    });
}

}  // namespace kvscope
