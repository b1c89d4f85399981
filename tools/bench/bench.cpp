#include "bench/bench.h"

#include "analysis/analyzer.h"
#include "analysis/suspect_search.h"
#include "analysis/threshold_check.h"
#include "analysis/analysis_json.h"
#include "analysis/heatmap_pyramid.h"
#include "diff/capture_diff.h"
#include "kv/capture_loader.h"
#include "util/work_team.h"
#include "gui/main_window.h"
#include "gui/prompt_page.h"
#include "widgets/heatmap_view.h"
#include "report/drawing_application.h"
#include "format/bundle_reader.h"
#include "quant/whatif.h"
#include "results/results_writer.h"
#include "results/stored_map.h"
#include "results/synthetic_results.h"
#include "synth/synthetic_capture.h"
#include "util/sibling_executables.h"

#include <QApplication>
#include <QElapsedTimer>
#include <QTimer>

#include <hdf5.h>

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iomanip>
#include <iostream>
#include <random>
#include <sstream>
#include <thread>

namespace kvscope::cli {

namespace {

using Clock = std::chrono::steady_clock;

double seconds(Clock::time_point since)
{
    return std::chrono::duration<double>(Clock::now() - since).count();
}

// The blocks the block tables of one snapshot reference for `layer` (what the analysis reads).
std::vector<std::int64_t> referencedBlocks(const BundleReader& reader, const PromptInfo& p, std::size_t snapshot,
                                           const std::string& layer)
{
    const BlockTable table = reader.readBlockTable(p.id, snapshot, std::size_t(reader.config().groupOf(layer)));
    std::vector<std::int64_t> ids;
    for (std::int32_t id : table.entries)
        if (id >= 0)
            ids.push_back(id);
    std::sort(ids.begin(), ids.end());
    ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
    return ids;
}

// Reads every KV element the analysis needs (the referenced engine blocks of every rank, both
// references) once, decodes it and sums it: the least any analysis must do.
double roofline(const std::string& path, int threads, std::uint64_t& bytes)
{
    const BundleReader reader(path);
    const std::vector<std::string> layers = reader.config().layerNames();
    std::atomic<int> next{0};
    std::atomic<std::uint64_t> total{0};
    std::vector<double> sums(std::size_t(threads), 0.0);
    auto work = [&](int self) {
        // Decoded a cache-sized piece at a time and summed in 16 independent lanes (vector
        // adds): the roofline costs the reading and decoding, not a serial chain of additions.
        constexpr std::int64_t kPiece = 4096;
        float buffer[kPiece];
        auto add = [&](const RawTensor& t) {
            float lanes[16] = {};
            for (std::int64_t at = 0; at < t.numel(); at += kPiece) {
                const std::int64_t n = std::min(kPiece, t.numel() - at);
                t.decode(at, n, buffer);
                std::int64_t i = 0;
                for (; i + 16 <= n; i += 16)
                    for (int k = 0; k < 16; ++k)
                        lanes[k] += buffer[i + k];
                for (; i < n; ++i)
                    lanes[0] += buffer[i];
            }
            for (float s : lanes)
                sums[std::size_t(self)] += s;
            total += t.bytes.size();
        };
        for (int l; (l = next++) < int(layers.size());) {
            const std::string& layer = layers[std::size_t(l)];
            for (const PromptInfo& p : reader.prompts()) {
                for (std::size_t s = 0; s < p.snapshots.size(); ++s) {
                    const std::vector<std::int64_t> ids = referencedBlocks(reader, p, s, layer);
                    for (int r : reader.config().layoutOf(layer).ranksRead())
                        for (KvPart part : {KvPart::K, KvPart::V})
                            add(reader.readEngineShard(p.id, s, r, layer, part, &ids).blocks);
                }
                for (ReferenceRole role : {ReferenceRole::Expected, ReferenceRole::Baseline}) {
                    if (role == ReferenceRole::Baseline && !p.hasBaseline)
                        continue;
                    const BundleReader::Reference ref = reader.readReference(p.id, role, layer);
                    add(ref.k);
                    add(ref.v);
                }
            }
        }
    };
    std::vector<std::thread> pool;
    for (int i = 1; i < threads; ++i)
        pool.emplace_back(work, i);
    work(0);
    for (std::thread& t : pool)
        t.join();
    bytes = total;
    double sum = 0;
    for (double s : sums)
        sum += s;
    return sum;
}

// Reading each layer's referenced engine blocks (scattered over the pool) against reading as
// many rows of the same dataset in one contiguous range: seconds for each, every layer once.
std::pair<double, double> blockReads(const std::string& path)
{
    const BundleReader reader(path);
    const PromptInfo& p = reader.prompts().front();
    double scattered = 0, contiguous = 0;
    const std::vector<std::string> layers = reader.config().layerNames();
    for (std::size_t l = 0; l < layers.size(); ++l) {
        const std::vector<std::int64_t> ids = referencedBlocks(reader, p, 0, layers[l]);
        // The same number of rows from the start of the dataset, in one range.
        // (Block ids: the first stored ones when only referenced blocks are kept, else 0, 1, ...)
        std::vector<std::int64_t> range;
        for (std::size_t i = 0; i < ids.size(); ++i)
            range.push_back(p.snapshots[0].subsetStored ? p.snapshots[0].storedBlockIds[i] : std::int64_t(i));
        auto timed = [&](const std::vector<std::int64_t>& rows, double& total) {
            const auto t0 = Clock::now();
            const PagedShard shard = reader.readEngineShard(p.id, 0, 0, layers[l], KvPart::K, &rows);
            total += seconds(t0);
            return shard.blocks.bytes.size();
        };
        // The first read of a dataset also loads its chunk index into libhdf5's cache: each
        // way goes first on every other layer.
        const std::size_t a = l % 2 ? timed(range, contiguous) : timed(ids, scattered);
        const std::size_t b = l % 2 ? timed(ids, scattered) : timed(range, contiguous);
        if (a != b)
            throw std::runtime_error("block read benchmark: sizes differ");
    }
    return {scattered, contiguous};
}

struct ChildResult {
    std::string output;
    int status = -1;
};

// Peak resident set of this process since exec (VmHWM), in kB. (getrusage's ru_maxrss
// would also count what a forked child inherited from the parent before exec.)
long peakRssKb()
{
    std::ifstream status("/proc/self/status");
    for (std::string line; std::getline(status, line);)
        if (line.rfind("VmHWM:", 0) == 0)
            return std::atol(line.c_str() + 6);
    return 0;
}

// Runs `kvscope ARGS...` (the command-line executable, as users start it) in a child.
ChildResult runChild(const std::vector<std::string>& args)
{
    const std::string cli = siblingExecutable("kvscope", "KVSCOPE_CLI");
    int pipeFds[2];
    ChildResult result;
    if (pipe(pipeFds) != 0)
        return result;
    const pid_t pid = fork();
    if (pid == 0) {
        dup2(pipeFds[1], STDOUT_FILENO);
        close(pipeFds[0]);
        if (const int devNull = open("/dev/null", O_WRONLY); devNull >= 0)
            dup2(devNull, STDERR_FILENO);  // Qt's offscreen chatter
        std::vector<char*> argv;
        for (const std::string& a : args)
            argv.push_back(const_cast<char*>(a.c_str()));
        argv.push_back(nullptr);
        execv(cli.c_str(), argv.data());
        _exit(127);
    }
    close(pipeFds[1]);
    char buffer[4096];
    for (ssize_t n; (n = read(pipeFds[0], buffer, sizeof buffer)) > 0;)
        result.output.append(buffer, std::size_t(n));
    close(pipeFds[0]);
    int status = 0;
    waitpid(pid, &status, 0);
    result.status = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    return result;
}

double bestOf(int runs, const std::vector<std::string>& args, long& peakRssKb, std::uint64_t* bytes)
{
    double best = 1e300;
    for (int i = 0; i < runs; ++i) {
        const ChildResult r = runChild(args);
        if (r.status != 0)
            throw std::runtime_error("bench child failed: " + r.output);
        std::istringstream in(r.output);
        double s = 0;
        std::uint64_t b = 0;
        long rss = 0;
        in >> s >> b >> rss;
        best = std::min(best, s);
        peakRssKb = std::max(peakRssKb, rss);
        if (bytes)
            *bytes = b;
    }
    return best;
}

// "1.234 s (2.10x)": `s` and its ratio to the roofline.
std::string timesRoof(double s, double roof)
{
    std::ostringstream text;
    text << std::fixed << std::setprecision(3) << s << " (" << std::setprecision(2) << s / roof << ")";
    return text.str();
}

// The views of a pan and zoom over a map of `tokens`: in from the whole map by halves, and at
// each zoom pans by a tenth of the view.
std::vector<std::pair<std::int64_t, std::int64_t>> panAndZoomViews(std::int64_t tokens)
{
    std::vector<std::pair<std::int64_t, std::int64_t>> views;
    for (std::int64_t width = tokens; width >= 16; width /= 2) {
        const std::int64_t from = (tokens - width) / 2;
        views.push_back({from, from + width});
        for (int step = 1; step <= 3; ++step)
            views.push_back({std::max<std::int64_t>(0, from - step * width / 10), std::max<std::int64_t>(1, from - step * width / 10 + width)});
    }
    return views;
}

// Pan and zoom over the first prompt's map (its default view), as the app redraws them: the
// visible tokens pooled to the view's pixel columns, then drawn. The slowest frame of
// panAndZoomViews from the pyramid as the app pools, and (the baseline, in the same run) from
// the full grid, as it pooled before.
std::pair<double, double> panAndZoomFrames(MainWindow& window)
{
    auto* view = &window.findChild<PromptPage*>()->heatmap();
    const std::shared_ptr<const AnalysisResult> result = window.controller().result();
    if (!result || result->prompts.empty())
        return {-1, -1};
    const HeatmapGrid full = buildHeatmap(result->prompts.front(), HeatmapSpec{});
    const HeatmapPyramid map(full, false);
    const std::int64_t pixels = std::max(100, view->axisRect()->width());
    double slowest = 0, slowestFromFull = 0;
    for (const auto& [from, to] : panAndZoomViews(full.columns)) {
        QElapsedTimer frame;
        frame.start();
        view->setGrid(map.window(from, to, pixels));
        view->replot(QCustomPlot::rpImmediateRefresh);
        slowest = std::max(slowest, frame.nsecsElapsed() / 1e9);
        frame.start();
        view->setGrid(poolColumns(full, from, to, pixels, false));
        view->replot(QCustomPlot::rpImmediateRefresh);
        slowestFromFull = std::max(slowestFromFull, frame.nsecsElapsed() / 1e9);
    }
    return {slowest, slowestFromFull};
}

// The same over a results file's stored map, as the app shows it: each view's window read off
// the GUI thread (the view keeps its pixels meanwhile), then drawn. The slowest frame (drawing)
// and the slowest read.
std::pair<double, double> storedPanAndZoomFrames(MainWindow& window, const std::string& resultsFile)
{
    auto* view = &window.findChild<PromptPage*>()->heatmap();
    const std::shared_ptr<const AnalysisResult> result = window.controller().result();
    if (!result || result->prompts.empty())
        return {-1, -1};
    const PromptAnalysis& p = result->prompts.front();
    const std::optional<StoredMap> map = StoredMap::open(resultsFile, 0, HeatmapSpec{}, int(p.layers.size()), p.tokens);
    if (!map)
        return {-1, -1};
    const std::int64_t pixels = std::max(100, view->axisRect()->width());
    double slowestFrame = 0, slowestRead = 0;
    for (const auto& [from, to] : panAndZoomViews(p.tokens)) {
        QElapsedTimer timer;
        timer.start();
        const HeatmapGrid grid = map->window(from, to, pixels);
        slowestRead = std::max(slowestRead, timer.nsecsElapsed() / 1e9);
        timer.start();
        view->setGrid(grid);
        view->replot(QCustomPlot::rpImmediateRefresh);
        slowestFrame = std::max(slowestFrame, timer.nsecsElapsed() / 1e9);
    }
    return {slowestFrame, slowestRead};
}

}  // namespace

namespace {

// bench-run gui: the app as a user meets it, offscreen.
int measureApp(const std::string& file, std::ostream& out)
{
    // The app as a user meets it (offscreen): the window shown, then the bundle opened;
    // times since the epoch for the window (the parent knows when it started us), and
    // since open() for the first heatmap row and the whole map.
    qputenv("QT_QPA_PLATFORM", "offscreen");
    const auto app = applicationForDrawing();
    MainWindow window;
    window.show();
    QCoreApplication::processEvents();
    const double shownAt = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
    double firstCells = -1, firstRow = -1, whole = -1;
    QElapsedTimer timer;
    // The first row drawn: the map is built off the GUI thread once a layer is analysed (a
    // results file's is read from the file at once); before it, the start of a long layer's
    // row, as its windows of tokens are analysed (the first cells).
    PromptPage* page = window.findChild<PromptPage*>();
    QObject::connect(page, &PromptPage::mapShown, &window, [&] {
        const std::vector<char>& ready = window.controller().readyLayers();
        if (!window.controller().result())
            return;
        const bool row = page->showsStoredMap() || std::any_of(ready.begin(), ready.end(), [](char r) { return r != 0; });
        if (firstCells < 0 && (row || page->rowStartShown() > 0))
            firstCells = timer.nsecsElapsed() / 1e9;
        if (firstRow < 0 && row)
            firstRow = timer.nsecsElapsed() / 1e9;
    });
    // The whole map: analysed (or, from a results file, every array read), and its last build
    // drawn. A build's lane ends just after it delivers the map, so once analysed this looks
    // again until nothing builds, and takes the time the last map was shown (or, where that was
    // before, the analysis finished).
    bool analysed = false;
    double lastShown = -1, analysedAt = -1;
    std::function<void()> wholeMapShown = [&] {
        if (!analysed || whole >= 0)
            return;
        if (!page->mapUpToDate()) {
            QTimer::singleShot(1, &window, wholeMapShown);
            return;
        }
        whole = std::max(lastShown, analysedAt);
        QCoreApplication::quit();
    };
    QObject::connect(page, &PromptPage::mapShown, &window, [&] { lastShown = timer.nsecsElapsed() / 1e9; });
    QObject::connect(page, &PromptPage::mapShown, &window, [&] { wholeMapShown(); });
    QObject::connect(&window.controller(), &AnalysisController::finished, &window, [&] {
        analysed = true;
        analysedAt = timer.nsecsElapsed() / 1e9;
        // (a stored map is not drawn again when the arrays are in: it was whole from the start)
        QTimer::singleShot(0, &window, [&] { wholeMapShown(); });
    });
    QObject::connect(&window.controller(), &AnalysisController::failed, &window, &QCoreApplication::quit);
    timer.start();
    window.openPath(QString::fromStdString(file));
    QCoreApplication::exec();
    const bool stored = page->showsStoredMap();
    const auto [frame, other] = stored ? storedPanAndZoomFrames(window, file) : panAndZoomFrames(window);
    out << std::fixed << std::setprecision(6) << shownAt << " " << firstRow << " " << whole << " " << frame << " "
        << other << " " << peakRssKb() << " " << (stored ? 1 : 0) << " " << firstCells << "\n";
    return whole < 0 ? 1 : 0;
}

// bench-run phases: where `kvscope analyze BUNDLE --json OUT` spends its time.
int measurePhases(const std::string& file, int threads, std::ostream& out)
{
    const auto start = Clock::now();
    // Where `kvscope analyze BUNDLE --json OUT` spends its time, phase by phase, in one
    // process: the crash guard's probe child, opening the bundle, the analysis, the JSON.
    const std::string json = file + ".bench.json";
    BundleReader::probeInChild(file);
    const double probe = seconds(start);
    auto t0 = Clock::now();
    auto reader = std::make_shared<BundleReader>(file);
    const double open = seconds(t0);
    t0 = Clock::now();
    AnalysisOptions options;
    options.threads = threads;
    const AnalysisResult result = analyzeBundle(reader, options);
    const double analysis = seconds(t0);
    t0 = Clock::now();
    {
        std::ofstream file(json, std::ios::binary);
        writeAnalysisJson(result, file);
    }
    const double written = seconds(t0);
    const std::uintmax_t bytes = std::filesystem::file_size(json);
    std::filesystem::remove(json);
    out << probe << " " << open << " " << analysis << " " << written << " " << bytes << "\n";
    return 0;
}

}  // namespace

int benchRun(const Args& args, std::ostream& out, std::ostream& err)
{
    if (args.size() != 3 && !(args.size() == 4 && args[0] == "diff")) {
        err << "kvscope: bench's measuring process takes KIND FILE THREADS (diff: KIND A THREADS B)\n";
        return 2;
    }
    const int threads = std::max(1, std::atoi(args[2].c_str()));
    const auto start = Clock::now();
    if (args[0] == "roofline") {
        std::uint64_t bytes = 0;
        const double sum = roofline(args[1], threads, bytes);
        out << seconds(start) << " " << bytes << " " << peakRssKb() << " " << sum << "\n";
        return 0;
    }
    if (args[0] == "capture") {  // bench-run capture FILE TOKENSxLAYERS-{pool,referenced,long}: a bench's capture alone
        int tokens = 0, layers = 0;
        char kind[16] = {};
        if (std::sscanf(args[2].c_str(), "%dx%d-%15s", &tokens, &layers, kind) != 3 || tokens < 4 || layers < 1)
            return 2;
        SyntheticCaptureOptions o = llama70bShape(tokens, layers);
        o.keepOnlyReferencedBlocks = std::string(kind) != "pool";
        if (std::string(kind) == "long")
            o.poolFactor = 1;  // as benchLongContext writes it
        writeSyntheticCapture(args[1], o);
        return 0;
    }
    if (args[0] == "metadata") {  // what kvscope inspect needs: the bundle opened, nothing of its KV read
        const BundleReader reader(args[1]);
        out << seconds(start) << " 0 " << peakRssKb() << " " << reader.prompts().size() << "\n";
        return 0;
    }
    if (args[0] == "blocks") {
        const auto [scattered, contiguous] = blockReads(args[1]);
        out << scattered << " " << contiguous << "\n";
        return 0;
    }
    if (args[0] == "gui")
        return measureApp(args[1], out);
    if (args[0] == "suspects") {
        // The analysis, then its suspects found again on their own: their share of the time.
        AnalysisOptions options;
        options.threads = threads;
        auto reader = std::make_shared<BundleReader>(args[1]);
        const AnalysisResult result = analyzeBundle(reader, options);
        const double analysis = seconds(start);
        const CaptureLoader loader(reader);
        WorkTeam team(threads);
        const auto found = Clock::now();
        std::string named = "none";
        for (const PromptAnalysis& p : result.prompts)
            for (const Suspect& s : findSuspects(loader, p, options.suspects, nullptr, &team))
                named = std::string(suspectPatternName(s.pattern)) + "/" + s.hypothesis.kind;
        out << analysis << " " << seconds(found) << " " << named << "\n";
        return 0;
    }
    if (args[0] == "phases")
        return measurePhases(args[1], threads, out);
    if (args[0] == "save") {
        // kvscope analyze --save: the analysis writing its results file as it streams.
        AnalysisOptions options;
        options.threads = threads;
        const std::string saved = args[1] + ".bench.kvres";
        analyzeAndSave(std::make_shared<BundleReader>(args[1]), options, saved);
        const double elapsed = seconds(start);
        const std::uintmax_t bytes = std::filesystem::file_size(saved);
        std::filesystem::remove(saved);
        out << elapsed << " " << bytes << " " << peakRssKb() << " 0\n";
        return 0;
    }
    if (args[0] == "whatif") {
        // kvscope whatif's four default schemes (fp8 e4m3 per tensor and per head, int8 per
        // token and head, int4 in groups of 32), as the command runs them.
        const CaptureLoader loader(std::make_shared<BundleReader>(args[1]));
        WorkTeam team(threads);
        WhatIfOptions options;
        options.team = &team;
        const WhatIfResult result = runWhatIf(loader, options);
        out << seconds(start) << " 0 " << peakRssKb() << " " << result.schemes.size() << "\n";
        return 0;
    }
    if (args[0] == "diff") {
        // kvscope diff A B as the command runs it: A reduced to its cell ratios, then B, then
        // the comparison and the change's suspects.
        AnalysisOptions options;
        options.threads = threads;
        options.searchSuspects = false;
        options.bcs.reset();
        const DiffSide a = loadDiffSide(args[1], options);
        const auto reader = std::make_shared<BundleReader>(args[3]);
        const AnalysisResult b = analyzeForVerdict(reader, options);
        const DiffResult d = diffAnalyses(a, b, CaptureLoader(reader, UnreadableBlockPolicy::Error), {});
        out << seconds(start) << " 0 " << peakRssKb() << " " << changeName(d.verdict()) << "\n";
        return 0;
    }
    if (args[0] == "analyze" || args[0] == "analyze-all" || args[0] == "check") {
        AnalysisOptions options;
        options.threads = threads;
        if (args[0] != "analyze-all") {  // (everything, as kvscope analyze --json computes)
            options.fingerprints = false;
            // as kvscope analyze without --json or --save, or kvscope check with its defaults
            options.bcs = args[0] == "analyze" ? BcNeeds::summary(false) : BcNeeds::verdict(false);
        }
        const AnalysisResult result = analyzeBundle(std::make_shared<BundleReader>(args[1]), options);
        out << seconds(start) << " 0 " << peakRssKb() << " " << result.prompts.size() << "\n";
        return 0;
    }
    return 2;
}

namespace {

// One bundle as users run kvscope on it, whole processes timed from the outside (start-up, the
// crash guard's children and the JSON included), against reading the bytes it needs once; then
// where the time goes, phase by phase.
int benchEndToEnd(const std::string& bundle, int threads, int runs, std::ostream& out)
{
    const std::string t = std::to_string(threads), json = bundle + ".bench.json";
    const auto wall = [&](const std::vector<std::string>& command) {
        double best = 1e300;
        for (int i = 0; i < runs; ++i) {
            const auto t0 = Clock::now();
            const ChildResult r = runChild(command);
            if (r.status != 0 && r.status != 1)
                throw std::runtime_error("bench: " + command[1] + " failed: " + r.output);
            best = std::min(best, seconds(t0));
        }
        return best;
    };
    runChild({"kvscope", "bench-run", "roofline", bundle, t});  // the page cache warm
    std::uint64_t needed = 0;
    long rss = 0;
    bestOf(1, {"kvscope", "bench-run", "roofline", bundle, t}, rss, &needed);
    const double roof = wall({"kvscope", "bench-run", "roofline", bundle, t});
    const double metadata = wall({"kvscope", "bench-run", "metadata", bundle, t});
    const double inspect = wall({"kvscope", "inspect", bundle});
    const double summary = wall({"kvscope", "analyze", bundle, "--threads", t});
    const double withJson = wall({"kvscope", "analyze", bundle, "--threads", t, "--json", json});
    const double verdict = wall({"kvscope", "check", bundle});  // (on every core, as CI runs it)
    std::filesystem::remove(json);
    double probe = 1e300, open = 1e300, analysis = 1e300, written = 1e300;
    std::uint64_t jsonBytes = 0;
    for (int i = 0; i < runs; ++i) {
        std::istringstream in(runChild({"kvscope", "bench-run", "phases", bundle, t}).output);
        double p = 0, o = 0, a = 0, w = 0;
        in >> p >> o >> a >> w >> jsonBytes;
        probe = std::min(probe, p), open = std::min(open, o), analysis = std::min(analysis, a), written = std::min(written, w);
    }
    out << "end to end: " << bundle << " (" << std::filesystem::file_size(bundle) / 1000000 << " MB, "
        << needed / 1000000 << " MB needed), " << threads << " thread(s), whole processes, best of " << runs << "\n"
        << std::fixed << std::setprecision(3)
        << "  read the needed bytes once (roofline)   " << roof << " s\n"
        << "  open the bundle once (its metadata)     " << metadata << " s\n"
        << "  kvscope inspect                         " << inspect << " s = " << std::setprecision(2)
        << inspect / metadata << "x opening it\n" << std::setprecision(3)
        << "  kvscope analyze                         " << summary << " s = " << std::setprecision(2)
        << summary / roof << "x the roofline\n" << std::setprecision(3)
        << "  kvscope analyze --json                  " << withJson << " s = " << std::setprecision(2)
        << withJson / roof << "x the roofline\n" << std::setprecision(3)
        << "  kvscope check                           " << verdict << " s = " << std::setprecision(2)
        << verdict / roof << "x the roofline\n"
        << "where analyze --json's time goes (one process, phase by phase):\n" << std::setprecision(1)
        << "  the crash guard's probe child           " << 1000 * probe << " ms\n"
        << "  opening the bundle (metadata)           " << 1000 * open << " ms\n"
        << "  the analysis                            " << 1000 * analysis << " ms\n"
        << "  the JSON (" << jsonBytes / 1000000 << " MB)                       " << 1000 * written << " ms = "
        << std::setprecision(0) << jsonBytes / 1e6 / written << " MB/s\n";
    return 0;
}

// Contexts longer than kLongContext tokens: one capture (its blocks scattered over a pool of the
// sequence's size: a larger one would not fit a desktop's disk), and what bounded memory is about.
constexpr int kLongContext = 16384;

// The app, offscreen, opening `opened`: what bench-run gui measures, as a line.
std::string appFigures(const std::string& opened, const std::string& threads)
{
    std::istringstream in(runChild({"kvscope", "bench-run", "gui", opened, threads}).output);
    double shownAt = 0, firstRow = -1, whole = -1, frame = -1, other = -1, firstCells = -1;
    long rss = 0;
    int stored = 0;
    in >> shownAt >> firstRow >> whole >> frame >> other >> rss >> stored >> firstCells;
    std::ostringstream line;
    line << std::fixed << std::setprecision(2);
    if (firstCells < firstRow)  // a long layer's row drawn as it fills
        line << "first cells " << firstCells << " s, ";
    line << "first row " << firstRow << " s, "
         << (stored ? "every array read " : "whole map ") << whole << " s, slowest pan/zoom frame " << std::setprecision(1)
         << 1000 * frame << " ms";
    if (stored)
        line << " (window read off the GUI thread: slowest " << 1000 * other << " ms)";
    line << "; peak RSS " << rss / 1024 << " MB";
    return line.str();
}

int benchLongContext(int tokens, int layers, int threads, const std::filesystem::path& dir, bool keep, std::ostream& out)
{
    const std::string t = std::to_string(threads);
    const std::string path = (dir / ("bench-long-" + std::to_string(tokens) + "x" + std::to_string(layers) + ".h5")).string();
    const std::string saved = path + ".kvres";
    out << "long context: synthetic capture shaped like Llama-3.3-70B (8 KV heads x 128, bf16 engine and\n"
           "expected, fp32 baseline, block 16, TP 8), "
        << layers << " layers x " << tokens << " tokens, blocks scattered, " << threads
        << " thread(s), one run each\n\n" << std::fixed;
    auto t0 = Clock::now();
    if (!std::filesystem::exists(path)) {
        SyntheticCaptureOptions o = llama70bShape(tokens, layers);
        o.keepOnlyReferencedBlocks = true;
        o.poolFactor = 1;  // the writer holds a snapshot's pool in memory: the sequence's blocks, scattered
        writeSyntheticCapture(path, o);
        out << "  capture written              " << std::setprecision(1) << seconds(t0) << " s, "
            << std::filesystem::file_size(path) / 1000000 << " MB\n";
    }
    long rooflineRss = 0, analysisRss = 0, everyRss = 0, checkRss = 0, saveRss = 0;
    std::uint64_t needed = 0, savedBytes = 0;
    runChild({"kvscope", "bench-run", "roofline", path, t});  // the page cache as warm as it gets
    const double roof = bestOf(1, {"kvscope", "bench-run", "roofline", path, t}, rooflineRss, &needed);
    const double analysis = bestOf(1, {"kvscope", "bench-run", "analyze", path, t}, analysisRss, nullptr);
    const double every = bestOf(1, {"kvscope", "bench-run", "analyze-all", path, t}, everyRss, nullptr);
    const double verdict = bestOf(1, {"kvscope", "bench-run", "check", path, t}, checkRss, nullptr);
    const double save = bestOf(1, {"kvscope", "bench-run", "save", path, t}, saveRss, &savedBytes);
    out << "  read the needed bytes once   " << std::setprecision(2) << roof << " s (" << needed / 1000000
        << " MB; RSS " << rooflineRss / 1024 << " MB)\n"
        << "  analyze                      " << analysis << " s = " << analysis / roof << "x the roofline; peak RSS "
        << analysisRss / 1024 << " MB\n"
        << "  every BC (--json, the app)   " << every << " s = " << every / roof << "x the roofline; peak RSS "
        << everyRss / 1024 << " MB\n"
        << "  check                        " << verdict << " s = " << verdict / roof << "x the roofline; peak RSS "
        << checkRss / 1024 << " MB\n"
        << "  analyze --save               " << save << " s = " << save / every << "x every BC; results file "
        << savedBytes / 1000000 << " MB; peak RSS " << saveRss / 1024 << " MB\n";
    // The app, offscreen: from the bundle (analysing as it shows), and from its results file.
    if (runChild({"kvscope", "analyze", path, "--threads", t, "--save", saved}).status != 0)
        throw std::runtime_error("bench: analyze --save failed on " + path);
    for (const std::string& opened : {path, saved})
        out << "  the app from the " << (opened == path ? "bundle:      " : "results file:") << appFigures(opened, t) << "\n";
    // The app at full size, on a results file made without a capture (80 x 128k would not fit the disk).
    const std::string fixture = (dir / "bench-results-80x131072.kvres").string();
    t0 = Clock::now();
    if (!std::filesystem::exists(fixture)) {
        writeSyntheticResults(fixture, SyntheticResultsOptions{});
        out << "  80 x 131072 results file made without a capture (synth --results): " << std::setprecision(1)
            << seconds(t0) << " s, " << std::filesystem::file_size(fixture) / 1000000 << " MB\n";
    }
    out << "  the app from that file:      " << appFigures(fixture, t) << "\n";
    if (!keep)
        std::filesystem::remove(fixture);
    std::filesystem::remove(saved);
    if (!keep)
        std::filesystem::remove(path);
    return 0;
}

}  // namespace

namespace {

// Start-up: a command that loads nothing, and `check` on a tiny bundle, as separate processes;
// the app's window shown.
void benchStartup(const std::filesystem::path& dir, int threads, int runs, std::ostream& out)
{
    const std::string t = std::to_string(threads);
    const std::string tiny = (dir / "bench-tiny.h5").string();
    {
        SyntheticCaptureOptions o = demoCaptureOptions();
        o.layers = 2;
        o.promptLens = {8};
        o.decodeTokens = 4;
        o.faultLayer = -1;
        o.divergence = -1;
        writeSyntheticCapture(tiny, o);
    }
    const auto startup = [&](const std::vector<std::string>& command) {
        double best = 1e300;
        for (int i = 0; i < std::max(runs, 5); ++i) {
            const auto t0 = Clock::now();
            runChild(command);
            best = std::min(best, seconds(t0));
        }
        return best;
    };
    out << "start-up (fork + exec + exit):\n"
        << "  kvscope --help               " << std::fixed << std::setprecision(1)
        << 1000 * startup({"kvscope", "--help"}) << " ms\n"
        << "  kvscope check (2-layer file) " << 1000 * startup({"kvscope", "check", tiny}) << " ms\n";
    {
        double best = 1e300;
        for (int i = 0; i < std::max(runs, 5); ++i) {
            const double started =
                std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
            std::istringstream in(runChild({"kvscope", "bench-run", "gui", tiny, t}).output);
            double shownAt = 0;
            in >> shownAt;
            best = std::min(best, shownAt - started);
        }
        out << "  the app's window shown       " << 1000 * best << " ms (offscreen)\n";
    }
    std::filesystem::remove(tiny);
}

// The analysis against the roofline at L and 2L layers, the whole pool stored and only the
// referenced blocks; returns the app's rows of the same captures, for the table at the end.
std::string benchAnalysis(const std::filesystem::path& dir, int tokens, int layers, int threads, int runs, bool keep,
                          std::ostream& out)
{
    const std::string t = std::to_string(threads);
    out << "\nanalysis: synthetic capture shaped like Llama-3.3-70B (8 KV heads x 128, bf16 engine and expected,\n"
           "fp32 baseline, block 16, TP 8), "
        << tokens << " tokens, laid out as the Python writer leaves a vLLM cache: a pool 4x what the\n"
           "sequence uses, scattered block ids, -1 padding in the tables. roofline = read the bytes the\n"
           "analysis needs once (referenced blocks, references), decode and sum them, same threads.\n"
           "analysis = as kvscope analyze computes it to print its summary; every BC = as for --json, --save\n"
           "and the app (the reference tool's BC per token too, and the references' fingerprints);\n"
           "check = as kvscope check computes its verdict (the combined BCs against the noise floor only).\n"
           "block read = each layer's scattered referenced blocks / as many rows read as one range.\n\n"
        << std::left << std::setw(12) << "stored" << std::setw(8) << "layers" << std::setw(12) << "needed MB"
        << std::setw(13) << "roofline s" << std::setw(13) << "analysis s" << std::setw(8) << "ratio" << std::setw(15)
        << "every BC s (x)" << std::setw(16) << "check s (x)" << std::setw(12) << "block read" << std::setw(18)
        << "analysis RSS MB" << "(result arrays MB)\n";
    std::ostringstream guiRows;
    for (const bool referencedOnly : {false, true})
        for (int l : {layers, 2 * layers}) {
            const std::string path = (dir / ("bench-" + std::to_string(tokens) + "x" + std::to_string(l) +
                                              (referencedOnly ? "-referenced" : "-pool") + ".h5"))
                                         .string();
            if (!std::filesystem::exists(path)) {
                SyntheticCaptureOptions o = llama70bShape(tokens, l);
                o.keepOnlyReferencedBlocks = referencedOnly;
                writeSyntheticCapture(path, o);
            }
            long rooflineRss = 0, analysisRss = 0;
            std::uint64_t bytes = 0;
            runChild({"kvscope", "bench-run", "roofline", path, t});  // warm the page cache
            const double roof = bestOf(runs, {"kvscope", "bench-run", "roofline", path, t}, rooflineRss, &bytes);
            const double full = bestOf(runs, {"kvscope", "bench-run", "analyze", path, t}, analysisRss, nullptr);
            long unused = 0;
            const double every = bestOf(runs, {"kvscope", "bench-run", "analyze-all", path, t}, unused, nullptr);
            const double verdict = bestOf(runs, {"kvscope", "bench-run", "check", path, t}, unused, nullptr);
            // The app (every BC): the first heatmap row, and the whole map against the analysis it runs.
            double firstRow = 1e300, wholeMap = 1e300, frame = 1e300, fullGridFrame = 1e300;
            for (int i = 0; i < runs; ++i) {
                std::istringstream in(runChild({"kvscope", "bench-run", "gui", path, t}).output);
                double shownAt = 0, first = 1e300, whole = 1e300, f = 1e300, g = 1e300;
                in >> shownAt >> first >> whole >> f >> g;
                firstRow = std::min(firstRow, first);
                wholeMap = std::min(wholeMap, whole);
                frame = std::min(frame, f);
                fullGridFrame = std::min(fullGridFrame, g);
            }
            guiRows << std::left << std::setw(12) << (referencedOnly ? "referenced" : "whole pool") << std::setw(8) << l
                    << std::setw(16) << std::fixed << std::setprecision(3) << firstRow << std::setw(16) << wholeMap
                    << std::setw(16) << std::setprecision(2) << wholeMap / every << std::setprecision(1) << 1000 * frame
                    << " / " << 1000 * fullGridFrame << "\n";
            double blockRatio = 1e300;
            for (int i = 0; i < runs; ++i) {
                std::istringstream in(runChild({"kvscope", "bench-run", "blocks", path, t}).output);
                double scattered = 0, contiguous = 1;
                in >> scattered >> contiguous;
                blockRatio = std::min(blockRatio, scattered / contiguous);
            }
            // What the analysis must keep whatever the streaming: every metric of every cell.
            const double resultBytes = 4.0 * double(l) * tokens * (kMetricCount * 8 + 2) + 8.0 * l * (tokens / 2 + 1);
            out << std::setw(12) << (referencedOnly ? "referenced" : "whole pool") << std::setw(8) << l << std::setw(12)
                << std::fixed << std::setprecision(1) << double(bytes) / 1e6 << std::setw(13) << std::setprecision(3)
                << roof << std::setw(13) << full << std::setw(8) << std::setprecision(2) << full / roof << std::setw(15)
                << timesRoof(every, roof) << std::setw(16) << timesRoof(verdict, roof) << std::setw(12) << blockRatio << std::setw(18) << std::setprecision(0) << double(analysisRss) / 1024
                << resultBytes / 1e6 << std::endl;
            if (!keep)
                std::filesystem::remove(path);
        }
    return guiRows.str();
}

// One block of `layer` of the first prompt holding another sequence's KV (a stale block), on
// every rank, K and V: normal values of the block's own spread, which no layer or prompt of the
// capture holds, so that whose_kv.h searches every candidate it may and finds nothing: the
// suspects' worst case. (A bf16 cache: its values stored as uint16.)
void writeStaleBlock(const std::string& path, const std::string& layer)
{
    std::vector<std::string> datasets;
    {
        const BundleReader reader(path);
        const PromptInfo& p = reader.prompts().front();
        if (reader.config().firstCompared().dtype != DType::BFloat16)
            throw std::runtime_error("bench: a stale block is written into a bf16 cache only");
        for (std::size_t s = 0; s < p.snapshots.size(); ++s)
            for (int r = 0; r < reader.config().tpSize; ++r)
                for (const char* part : {"k", "v"})
                    datasets.push_back(bundle_path::engineKv(p.id, s, r, layer, part));
    }
    const hid_t file = H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
    if (file < 0)
        throw std::runtime_error("bench: cannot open " + path + " for writing");
    std::mt19937_64 random(54);
    bool ok = true;
    for (const std::string& name : datasets) {
        if (H5Lexists(file, name.c_str(), H5P_DEFAULT) <= 0)
            continue;  // a rank that holds nothing of this layer
        const hid_t d = H5Dopen2(file, name.c_str(), H5P_DEFAULT);
        const hid_t space = H5Dget_space(d);
        hsize_t dims[4] = {};
        ok = ok && H5Sget_simple_extent_ndims(space) == 4 && H5Sget_simple_extent_dims(space, dims, nullptr) == 4;
        // [stored, heads, block_size, head_size]: the middle stored block, whole.
        const hsize_t start[4] = {dims[0] / 2, 0, 0, 0}, count[4] = {1, dims[1], dims[2], dims[3]};
        const hid_t memory = H5Screate_simple(4, count, nullptr);
        std::vector<std::uint16_t> bits(std::size_t(dims[1] * dims[2] * dims[3]));
        ok = ok && H5Sselect_hyperslab(space, H5S_SELECT_SET, start, nullptr, count, nullptr) >= 0 &&
             H5Dread(d, H5T_NATIVE_UINT16, memory, space, H5P_DEFAULT, bits.data()) >= 0;
        const auto toFloat = [](std::uint16_t b) {
            const std::uint32_t u = std::uint32_t(b) << 16;
            float f;
            std::memcpy(&f, &u, sizeof f);
            return f;
        };
        double squares = 0;
        for (std::uint16_t b : bits)
            squares += double(toFloat(b)) * toFloat(b);
        std::normal_distribution<float> normal(0.0f, float(std::sqrt(squares / double(bits.size()))));
        for (std::uint16_t& b : bits) {
            const float f = normal(random);
            std::uint32_t u;
            std::memcpy(&u, &f, sizeof u);
            b = std::uint16_t(u >> 16);
        }
        ok = ok && H5Dwrite(d, H5T_NATIVE_UINT16, memory, space, H5P_DEFAULT, bits.data()) >= 0;
        H5Sclose(memory);
        H5Sclose(space);
        H5Dclose(d);
    }
    H5Fclose(file);
    if (!ok)
        throw std::runtime_error("bench: could not write a stale block into " + path);
}

// The suspects found again after the analysis (`bench-run suspects`), `runs` times: the best
// times, the least and the most of each run's share (the analysis and its suspects timed in
// one process, so that other load on the machine weighs on both alike), and the top suspect.
struct SuspectsShare {
    double analysis = 1e300, suspects = 1e300;
    double leastShare = 1e300, mostShare = 0;
    std::string top;
};
SuspectsShare suspectsShare(const std::string& path, const std::string& threads, int runs)
{
    SuspectsShare share;
    for (int i = 0; i < runs; ++i) {
        const ChildResult r = runChild({"kvscope", "bench-run", "suspects", path, threads});
        if (r.status != 0)
            throw std::runtime_error("bench child failed on " + path + ": " + r.output);
        std::istringstream in(r.output);
        double a = 1e300, s = 1e300;
        in >> a >> s >> share.top;
        share.analysis = std::min(share.analysis, a);
        share.suspects = std::min(share.suspects, s);
        share.leastShare = std::min(share.leastShare, s / a);
        share.mostShare = std::max(share.mostShare, s / a);
    }
    return share;
}

// The suspects' share of the analysis on the Llama-3.3-70B-shaped capture (referenced blocks),
// clean and with faults that take the search through each of its paths: explained at the
// fault's own place (rope_offset), another layer's KV found by whose_kv.h (other_layer), and a
// stale block that nothing explains, every candidate layer (and, with two prompts, the other
// prompt) searched in vain: the worst case.
void benchSuspects(const std::filesystem::path& dir, int tokens, int layers, int threads, int runs, bool keep,
                   std::ostream& out)
{
    const std::string t = std::to_string(threads);
    out << "\nsuspects found again after the analysis (" << layers << " layers x " << tokens
        << " tokens, Llama-3.3-70B's shape, referenced blocks; times best of " << runs
        << ", their share of the analysis least-most of the runs):\n";
    struct Case {
        std::string name;
        std::function<void(SyntheticCaptureOptions&)> shape;
        bool stale = false;
    };
    const int middle = layers / 2;
    const std::vector<Case> cases = {
        {"clean", [](SyntheticCaptureOptions&) {}},
        {"rope_offset, layer " + std::to_string(middle) + " head 3",
         [&](SyntheticCaptureOptions& o) { o.faultLayer = middle, o.faultHead = 3, o.faultPosition = 0; }},
        {"other_layer, layer " + std::to_string(middle) + " (whose KV: found)",
         [&](SyntheticCaptureOptions& o) { o.faultLayer = middle, o.faultOtherLayer = true; }},
        {"stale block, layer " + std::to_string(middle) + " (whose KV: nothing found)", [](SyntheticCaptureOptions&) {}, true},
        {"the same, two prompts of " + std::to_string(tokens) + " positions",
         [&](SyntheticCaptureOptions& o) { o.promptLens = {tokens / 2, tokens / 2}; }, true},
    };
    for (const Case& c : cases) {
        const std::string path = (dir / ("bench-suspects-" + std::to_string(tokens) + "x" + std::to_string(layers) + ".h5")).string();
        SyntheticCaptureOptions o = llama70bShape(tokens, layers);
        o.keepOnlyReferencedBlocks = true;
        c.shape(o);
        writeSyntheticCapture(path, o);
        if (c.stale) {
            const std::string layer = BundleReader(path).config().layerNames().at(std::size_t(middle));  // (closed again)
            writeStaleBlock(path, layer);
        }
        const SuspectsShare share = suspectsShare(path, t, runs);
        out << "  " << std::left << std::setw(58) << c.name << std::right << " analysis " << std::fixed
            << std::setprecision(3) << share.analysis << " s, suspects " << share.suspects << " s; share "
            << std::setprecision(1) << 100 * share.leastShare << "-" << 100 * share.mostShare << "% (top: " << share.top
            << ")" << std::defaultfloat << std::endl;
        if (!keep)
            std::filesystem::remove(path);
    }
}

// analyze --save, the what-if and diff against one analyze of a faulty capture (a RoPE fault).
void benchFaulty(const std::filesystem::path& dir, int tokens, int layers, int threads, int runs, bool keep,
                 std::ostream& out)
{
    const std::string t = std::to_string(threads);
    const std::string path = (dir / ("bench-faulty-" + std::to_string(tokens) + "x" + std::to_string(layers) + ".h5")).string();
    SyntheticCaptureOptions o = llama70bShape(tokens, layers);
    o.keepOnlyReferencedBlocks = true;
    o.faultLayer = layers / 2;
    o.faultHead = 3;
    o.faultPosition = 0;
    writeSyntheticCapture(path, o);
    // The what-if's four default schemes, and analyze --save, against one analyze of the
    // same capture computing every BC (as --save does), alternated.
    long whatIfRss = 0, analyzeRss = 0, saveRss = 0;
    double whatIf = 1e300, analyzed = 1e300, saved = 1e300;
    std::uint64_t savedBytes = 0;
    for (int i = 0; i < runs; ++i) {
        analyzed = std::min(analyzed, bestOf(1, {"kvscope", "bench-run", "analyze-all", path, t}, analyzeRss, nullptr));
        whatIf = std::min(whatIf, bestOf(1, {"kvscope", "bench-run", "whatif", path, t}, whatIfRss, nullptr));
        saved = std::min(saved, bestOf(1, {"kvscope", "bench-run", "save", path, t}, saveRss, &savedBytes));
    }
    out << "analyze --save (" << layers << " layers x " << tokens << " tokens): " << std::setprecision(3) << saved
        << " s against analyze (every BC) " << analyzed << " s = " << std::setprecision(2) << saved / analyzed
        << "x; results file " << std::setprecision(3) << savedBytes / 1e6 << " MB; RSS " << saveRss / 1024
        << " MB against " << analyzeRss / 1024 << " MB\n";
    out << "whatif, four schemes (" << layers << " layers x " << tokens << " tokens): " << std::setprecision(3)
        << whatIf << " s against analyze (every BC) " << analyzed << " s = " << std::setprecision(2) << whatIf / analyzed
        << "x (goal: at most 2x); RSS " << whatIfRss / 1024 << " MB against " << analyzeRss / 1024 << " MB\n";
    // kvscope diff of a clean capture (A) against this faulty one (B), against one analyze of B.
    const std::string clean = (dir / ("bench-clean-" + std::to_string(tokens) + "x" + std::to_string(layers) + ".h5")).string();
    o.faultLayer = -1;
    writeSyntheticCapture(clean, o);
    long diffRss = 0;
    double diffed = 1e300;
    for (int i = 0; i < runs; ++i)
        diffed = std::min(diffed, bestOf(1, {"kvscope", "bench-run", "diff", clean, t, path}, diffRss, nullptr));
    out << "diff, clean A against the faulty B: " << std::setprecision(3) << diffed << " s against analyze of B (every BC) "
        << analyzed << " s = " << std::setprecision(2) << diffed / analyzed << "x (goal: at most 2.2x); RSS "
        << diffRss / 1024 << " MB against " << analyzeRss / 1024 << " MB\n";
    if (!keep)
        std::filesystem::remove(clean);
    if (!keep)
        std::filesystem::remove(path);
}

}  // namespace

int bench(const Args& args, std::ostream& out, std::ostream& err)
{
    int tokens = 2048, layers = 80, threads = int(std::max(1u, std::thread::hardware_concurrency())), runs = 3;
    std::string dirName = (std::filesystem::temp_directory_path() / "kvscope-bench").string();
    bool keep = false;
    OptionParser parser("bench");
    parser.integer("--tokens", tokens);
    parser.integer("--layers", layers);
    parser.integer("--threads", threads);
    parser.integer("--runs", runs);
    parser.text({"--dir"}, dirName);
    parser.flag("--keep", keep);
    bool suspectsOnly = false;
    parser.flag("--suspects", suspectsOnly);
    std::string endToEnd;
    parser.text({"--end-to-end"}, endToEnd);
    if (!parser.parse(args, err))
        return 2;
    if (!endToEnd.empty())
        return benchEndToEnd(endToEnd, threads, std::max(runs, 5), out);
    const std::filesystem::path dir = dirName;
    if (tokens < 4 || layers < 1 || threads < 1 || runs < 1) {
        err << "kvscope bench: tokens, layers, threads and runs must be positive\n";
        return 2;
    }
    std::filesystem::create_directories(dir);
    if (suspectsOnly) {
        out << "kvscope bench --suspects, " << threads << " thread(s)\n";
        benchSuspects(dir, tokens, layers, threads, runs, keep, out);
        return 0;
    }
    if (tokens > kLongContext)
        return benchLongContext(tokens, layers, threads, dir, keep, out);
    out << "kvscope bench, " << threads << " thread(s), best of " << runs << "\n\n";
    benchStartup(dir, threads, runs, out);
    const std::string guiRows = benchAnalysis(dir, tokens, layers, threads, runs, keep, out);
    benchSuspects(dir, tokens, layers, threads, runs, keep, out);
    benchFaulty(dir, tokens, layers, threads, runs, keep, out);
    out << "\nthe app (offscreen), from opening the bundle:\n" << std::left << std::setw(12) << "stored" << std::setw(8)
        << "layers" << std::setw(16) << "first row s" << std::setw(16) << "whole map s" << std::setw(16)
        << "map / every BC" << "pan/zoom frame ms, slowest (pooled from the full grid)\n"
        << guiRows;
    return 0;
}

RunCommand benchCommand(const std::string& name)
{
    return name == "bench" ? bench : name == "bench-run" ? benchRun : nullptr;
}

}  // namespace kvscope::cli
