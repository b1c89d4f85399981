#pragma once
// Opens a bundle (or imports a folder of dumps) and analyses it in a worker thread, reporting
// progress and each finished layer by signal; the GUI thread never loads or computes.

#include "analysis/analyzer.h"
#include "analysis/heatmap_grid.h"
#include "kv/capture_loader.h"
#include "results/analysis_record.h"

#include "gui/background_tasks.h"

#include <QObject>
#include <QTemporaryDir>

#include <atomic>
#include <functional>
#include <memory>
#include <mutex>

namespace kvscope {

struct HeadErrorHistogram;

class AnalysisController : public QObject {
    Q_OBJECT

public:
    explicit AnalysisController(QObject* parent = nullptr);
    ~AnalysisController() override;

    // A bundle file, a results file (read, not analysed: every layer is ready with opened()), a
    // folder of bundles or several bundles (a sweep, analysed as one: kv/sweep.h), or a folder
    // of dumps (imported into a temporary bundle first). A finished (or cancelled) analysis
    // stays until the new one opens, and stays if it fails to open or is cancelled before:
    // then result() and path() are the kept one's.
    void open(const QString& path) { open(QStringList{path}); }
    void open(const QStringList& paths);
    void cancel();
    bool isRunning() const { return m_running; }

    // The file or folder open; a sweep of several files: the first "and N more".
    QString path() const { return m_path; }
    // The open bundle: the one way the app reads it (null before opened()).
    std::shared_ptr<const CaptureLoader> loader() const { return m_loader; }
    // Valid from opened(); a layer's cells are final once layerReady(layer).
    std::shared_ptr<const AnalysisResult> result() const { return m_result; }
    // A results file whose bundle is not at hand: why (its KV views cannot be shown); else empty.
    QString bundleMissing() const { return m_bundleMissing; }
    // What the open analysis ran with (a results file's: as it was saved).
    const RecordedOptions& recorded() const { return m_recorded; }
    // The results file open (its stored maps: results/stored_map.h), or empty for a bundle.
    QString resultsFile() const { return m_resultsFile; }
    bool layerReady(int layer) const { return layer >= 0 && std::size_t(layer) < m_ready.size() && m_ready[std::size_t(layer)]; }
    const std::vector<char>& readyLayers() const { return m_ready; }
    // The map a page shows (prompt index and what of it): while a long layer is analysed a
    // window of tokens at a time, the start of its row in that map comes with rowStarted().
    void followMap(int prompt, const HeatmapSpec& spec);
    // Called on the worker thread after each window of a layer read in windows (the layer and
    // the tokens done of it, AnalysisOptions::windowDone): lets a test hold the analysis there.
    void setWorkerWindowHook(std::function<void(int, qint64)> hook) { m_workerWindowHook = std::move(hook); }
    // Tests: layers longer than this many tokens are analysed in windows of it (0: by their bytes).
    void setWindowTokens(qint64 tokens) { m_windowTokens = tokens; }
    // Called on the worker thread after each finished layer, with the count so far: lets a
    // test act at a known point of the analysis (e.g. cancel after the first layer).
    void setWorkerLayerHook(std::function<void(int)> hook) { m_workerLayerHook = std::move(hook); }
    // Runs in the child process that opens a bundle before the app does (BundleReader::probeInChild).
    void setProbeHook(std::function<void()> hook) { m_probeHook = std::move(hook); }

    // The error histograms of one head of the open bundle over tokens [begin, end), read off
    // the GUI thread; `done` gets them on the GUI thread, or why they could not be read
    // (not called when another bundle was opened since: the caller drops it with the cell).
    using HistogramDone = std::function<void(std::shared_ptr<const HeadErrorHistogram> histogram, const QString& error)>;
    void requestHeadHistogram(const std::string& promptId, const std::string& layer, int head, KvPart part,
                              qint64 begin, qint64 end, HistogramDone done);

    // Writes the finished analysis to a results file off the GUI thread; `done` gets, on the GUI
    // thread, an empty string or why it could not be written.
    void saveResults(const QString& file, std::function<void(const QString& error)> done);

signals:
    void opened(const QString& path);
    void progress(int done, int total, const QString& what);
    void layerFinished(int layer);
    // The start of `layer`'s row in the followed map (followMap), the layer not yet finished:
    // one row, tokens [0, row->columns).
    void rowStarted(int layer, int prompt, const kvscope::HeatmapSpec& spec, std::shared_ptr<const kvscope::HeatmapGrid> row);
    void finished();
    void failed(const QString& message);
    void cancelled();

private:
    // One open(): what its run on the worker thread needs.
    struct OpenRun {
        QString path;
        std::vector<std::string> bundles;
        bool sweep = false;
        int generation = 0;
        std::shared_ptr<QTemporaryDir> importDir;  // a folder of dumps is imported here first
        std::shared_ptr<std::atomic<bool>> cancel;
        std::function<void(int)> layerHook;
        std::function<void(int, qint64)> windowHook;
        qint64 windowTokens = 0;
        std::function<void()> probeHook;
    };
    // On the worker thread: import, probe, then read a results file or analyse a bundle.
    void runOpen(const OpenRun& run);
    void readResults(const OpenRun& run, const std::string& file, bool& wasOpened);
    void analyse(const OpenRun& run, const std::string& bundle, bool& wasOpened);
    // After a window of a long layer: the start of its row in the followed map, to the GUI thread.
    void showRowStart(int generation, const AnalysisResult& result, int layer, std::size_t first, std::size_t end,
                      std::int64_t tokens);
    void post(std::function<void()> fn, int generation);
    // The run ended without finishing (failed or cancelled).
    void stopped();

    QString m_path;
    QString m_keptPath;  // the analysis shown while another opens
    QString m_bundleMissing;
    QString m_resultsFile;
    RecordedOptions m_recorded;  // what the open analysis ran with, for saving it
    std::shared_ptr<const CaptureLoader> m_loader;
    std::shared_ptr<AnalysisResult> m_result;
    std::vector<char> m_ready;
    std::shared_ptr<std::atomic<bool>> m_cancel = std::make_shared<std::atomic<bool>>(false);  // this run's
    std::atomic<int> m_generation{0};
    bool m_running = false;
    std::shared_ptr<QTemporaryDir> m_importDir;  // holds an imported folder's bundle while it is open
    std::function<void(int)> m_workerLayerHook;
    std::function<void(int, qint64)> m_workerWindowHook;
    qint64 m_windowTokens = 0;
    struct FollowedMap {
        int prompt = -1;
        HeatmapSpec spec;
    };
    mutable std::mutex m_followedMutex;  // the worker reads m_followed
    FollowedMap m_followed;
    std::function<void()> m_probeHook;
    // The runs, last so that it goes first: a cancelled older run may still be reading its
    // last layer and posting to this object, so destruction waits for all of them.
    BackgroundTasks m_tasks;
};

}  // namespace kvscope
