#pragma once
// The open capture, and the way to the engine: opens a bundle (or imports a folder of dumps)
// and analyses it off the GUI thread, through its door (engine_door.h), which every page
// asks through too. The viewers it tells (capture_viewer.h), then its signals, say what
// happened; the GUI thread never loads or computes.

#include "analysis/analyzer.h"
#include "analysis/heatmap_grid.h"
#include "kv/capture_loader.h"
#include "results/analysis_record.h"

#include "gui/capture_viewer.h"
#include "gui/engine_door.h"

#include <QObject>
#include <QTemporaryDir>

#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <vector>

namespace kvscope {

struct ResultsFile;

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
    // Opens `path` once a child process (`makeArgv`, killed on cancel) has made it, with
    // `making` as the progress text meanwhile: the demo's capture, made on first use while
    // the window is already up. Nothing is made when the file exists.
    void openMade(const QString& path, const std::vector<std::string>& makeArgv, const QString& making);
    void cancel();
    bool isRunning() const { return m_running; }
    // Told what happens to the open capture, in the order they were added (before the signals).
    void addViewer(CaptureViewer* viewer) { m_viewers.push_back(viewer); }
    // The one way from the GUI to the engine: every page asks through it.
    EngineDoor& door() { return m_door; }
    // What open() was given, as it can be opened again (an imported folder: its bundle).
    QStringList inputs() const { return m_inputs; }

    // The file or folder open; a sweep of several files: the first "and N more".
    QString path() const { return m_path; }
    // The open bundle: the one way the app reads it (null before opened()).
    std::shared_ptr<const CaptureLoader> loader() const { return m_loader; }
    // Valid from opened(); a layer's cells are final once layerReady(layer).
    std::shared_ptr<const AnalysisResult> result() const { return m_result; }
    // A results file whose bundle is not at hand: why (its KV views cannot be shown); else empty.
    QString bundleMissing() const { return m_bundleMissing; }
    // A results file whose bundle was not found: tries `bundle` (checked to be the one
    // analysed); bundleLocated() after, with bundleMissing() saying why not when it is not.
    void locateBundle(const QString& bundle);
    // What the open analysis ran with (a results file's: as it was saved).
    const RecordedOptions& recorded() const { return m_recorded; }
    // The results file open (its stored maps: results/stored_map.h), or empty for a bundle.
    QString resultsFile() const { return m_resultsFile; }
    bool layerReady(int layer) const { return layer >= 0 && std::size_t(layer) < m_ready.size() && m_ready[std::size_t(layer)]; }
    const std::vector<char>& readyLayers() const { return m_ready; }
    // The map a page shows (prompt index and what of it): while a long layer is analysed a
    // window of tokens at a time, the start of its row in that map comes with rowStarted().
    void followMap(int prompt, const HeatmapSpec& spec);
    // The error histograms of one head of the open bundle over tokens [begin, end), read off
    // the GUI thread; `done` gets them on the GUI thread, or why they could not be read
    // (not called when another bundle was opened since: the caller drops it with the cell).
    using HistogramDone = std::function<void(std::shared_ptr<const HeadErrorHistogram> histogram, const QString& error)>;
    void requestHeadHistogram(const std::string& promptId, const std::string& layer, int head, KvPart part,
                              qint64 begin, qint64 end, HistogramDone done);
    // The same of one cell of a state-space layer's recurrent state at a checkpoint
    // (analysis/head_error_histogram.h's stateErrorHistogram).
    void requestStateHistogram(const std::string& promptId, const std::string& layer, qint64 position,
                               const std::string& part, qint64 cell, HistogramDone done);

    // Writes the finished analysis to a results file off the GUI thread; `done` gets, on the GUI
    // thread, an empty string or why it could not be written.
    void saveResults(const QString& file, std::function<void(const QString& error)> done);
    // Writes the HTML report of the open capture into `folder` (with the what-if when
    // `withWhatIf`), in a child process: drawing its images takes the app's widgets, which this
    // process keeps for the window. `done` gets, on the GUI thread, the report's page or why not.
    void writeReport(const QString& folder, bool withWhatIf, std::function<void(const QString& html, const QString& error)> done);

signals:
    void opened(const QString& path);
    void progress(int done, int total, const QString& what);
    void layerFinished(int layer);
    // The start of `layer`'s row in the followed map (followMap), the layer not yet finished:
    // one row, tokens [0, row->columns).
    void rowStarted(int layer, int prompt, const kvscope::HeatmapSpec& spec, std::shared_ptr<const kvscope::HeatmapGrid> row);
    void finished();
    void bundleLocated();
    void failed(const QString& message);
    void cancelled();

private:
    friend class AnalysisControllerTesting;  // tests/support: holds the worker at known points
    // Called on the worker thread: after each finished layer (the count so far), after each
    // window of a layer read in windows, and in the child that probes a bundle.
    struct TestHooks {
        std::function<void(int)> layer;
        std::function<void(int, qint64)> window;
        qint64 windowTokens = 0;  // layers longer than this are analysed in windows of it (0: by bytes)
        std::function<void()> probe;
    };
    // One open(): what its run on the worker thread needs.
    struct OpenRun {
        QString path;
        std::vector<std::string> bundles;
        bool sweep = false;
        std::shared_ptr<QTemporaryDir> importDir;  // a folder of dumps is imported here first
        std::vector<std::string> makeArgv;  // a child that makes the bundle first (openMade)
        QString making;
        TestHooks hooks;
    };
    // On the worker thread: import, probe, then read a results file or analyse a bundle.
    void openMade(const QStringList& paths, const std::vector<std::string>& makeArgv, const QString& making);
    void runOpen(const OpenRun& run, const EngineJob& job);
    void makeBundle(const OpenRun& run, const EngineJob& job);
    void readResults(const OpenRun& run, const EngineJob& job, const std::string& file, bool& wasOpened);
    void analyse(const OpenRun& run, const EngineJob& job, const std::string& bundle, bool& wasOpened);
    // After a window of a long layer: the start of its row in the followed map, to the GUI thread.
    void showRowStart(const EngineJob& job, const AnalysisResult& result, int layer, std::size_t first, std::size_t end,
                      std::int64_t tokens);
    // On the GUI thread: the capture opened (its shapes), a layer of it analysed.
    void adopt(std::shared_ptr<const CaptureLoader> loader, std::shared_ptr<AnalysisResult> result, int layers,
                std::shared_ptr<QTemporaryDir> importDir);
    void layerDone(int layer);
    // The run ended without finishing: failed (`error`) or cancelled (empty).
    void stopped(const QString& error, bool wasOpened);
    void forget();  // nothing is open
    template <typename... Args, typename... Given>
    void tell(void (CaptureViewer::*event)(Args...), Given&&... args)
    {
        for (CaptureViewer* viewer : m_viewers)
            (viewer->*event)(args...);
    }

    QString m_path;
    QString m_keptPath;  // the analysis shown while another opens
    QString m_bundleMissing;
    QString m_resultsFile;
    std::shared_ptr<const ResultsFile> m_results;  // the open results file's record (locateBundle)
    RecordedOptions m_recorded;  // what the open analysis ran with, for saving it
    std::shared_ptr<const CaptureLoader> m_loader;
    std::shared_ptr<AnalysisResult> m_result;
    std::vector<char> m_ready;
    bool m_running = false;
    bool m_opened = false;  // the running open() has opened
    QStringList m_inputs;
    std::shared_ptr<QTemporaryDir> m_importDir;  // holds an imported folder's bundle while it is open
    std::vector<CaptureViewer*> m_viewers;
    TestHooks m_hooks;
    struct FollowedMap {
        int prompt = -1;
        HeatmapSpec spec;
    };
    mutable std::mutex m_followedMutex;  // the worker reads m_followed
    FollowedMap m_followed;
    // Last, so that it goes first: a cancelled run may still be reading its last layer and
    // delivering to this object, so destruction waits for every request.
    EngineDoor m_door{this};
};

}  // namespace kvscope
