// Opening bundles in the app under QT_QPA_PLATFORM=offscreen: the analysis in the background,
// broken files, cancels, imports, a second bundle while the first analyses, files that change
// under the window, a crashing HDF5 library: each a message, never a crash or a stale view.

#include "gui_test_support.h"
#include "analysis_controller_testing.h"

#include "analysis/analysis_json.h"
#include "gui/head_table_model.h"
#include "gui/worst_cells_model.h"
#include "widgets/histogram_view.h"
#include "widgets/plot_export.h"
#include "widgets/token_line_view.h"

#include <QAbstractItemModelTester>
#include <QApplication>
#include <QComboBox>
#include <QDir>
#include <QElapsedTimer>
#include <QFile>
#include <QHeaderView>
#include <QImage>
#include <QLabel>
#include <QListWidget>
#include <QScopeGuard>
#include <QScrollBar>
#include <QSortFilterProxyModel>
#include <QStatusBar>
#include <QTableView>
#include <QTabWidget>
#include <QTimer>
#include <QToolBar>
#include <QWheelEvent>

#include <atomic>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <future>
#include <optional>
#include <sstream>
#include <algorithm>

using namespace kvscope;
using namespace kvtest;

class TestOpening : public GuiSuite {
    Q_OBJECT

private slots:
    void initTestCase() { initDemo(); }
    void opensAndAnalysesInTheBackground();
    void brokenBundleIsAMessageNotACrash();
    void closingWhileSeveralRunsAnalyseIsSafe();
    void failedOpenLeavesNothingStale();
    void cancelKeepsWhatWasAnalysed();
    void bundleTruncatedOrReplacedWhileOpen();
    void importCanBeCancelledAndClosed();
    void secondBundleWhileTheFirstAnalyses();
    void hdf5CrashIsAMessage();
    void brokenFileKeepsTheOpenAnalysis();
    void aFolderGivenByMistakeSaysSo();
    void resultsFileOpensAtOnce();
    void longLayerFillsAsItIsAnalysed();
    void viewersAreToldInOrder();
    void reportIsWrittenOffTheGuiThread();
    void aBundleMadeFirstOpensWhenMade();
};

void TestOpening::opensAndAnalysesInTheBackground()
{
    QSignalSpy layers(&m_window->controller(), &AnalysisController::layerFinished);
    QSignalSpy opened(&m_window->controller(), &AnalysisController::opened);
    openDemo();
    QCOMPARE(opened.count(), 1);
    QCOMPARE(layers.count(), 8);  // the heatmap filled in layer by layer
    QVERIFY(m_window->controller().result());
}

void TestOpening::brokenBundleIsAMessageNotACrash()
{
    const QString broken = m_dir.filePath("broken.h5");
    QFile::copy(m_path, broken);
    QFile(broken).resize(QFile(broken).size() / 3);
    QSignalSpy failed(&m_window->controller(), &AnalysisController::failed);
    m_window->openPath(broken);
    QVERIFY(failed.wait(20000));
    QVERIFY2(failed.first().first().toString().contains(broken), qPrintable(failed.first().first().toString()));
}

void TestOpening::closingWhileSeveralRunsAnalyseIsSafe()
{
    // Each open() cancels the run before it, which may still be reading a layer and posting
    // to the controller: closing the window must wait for all of them, not only the latest.
    for (int round = 0; round < 3; ++round) {
        auto window = std::make_unique<MainWindow>();
        for (int i = 0; i < 4; ++i)
            window->openPath(m_path);
        QCoreApplication::processEvents();
        window.reset();
        QCoreApplication::processEvents();  // anything a stale run posted would run now
    }
}

// With nothing open before, a failed open leaves nothing of it on screen. (Over an open
// analysis, that analysis stays: brokenFileKeepsTheOpenAnalysis.)
void TestOpening::failedOpenLeavesNothingStale()
{
    ensureDemoOpen();  // so that Open Recent holds the demo
    MainWindow fresh;
    fresh.resize(1280, 800);
    fresh.show();
    QVERIFY(QTest::qWaitForWindowExposed(&fresh));
    const QString broken = m_dir.filePath("stale.h5");
    QFile::remove(broken);
    QFile::copy(m_path, broken);
    QFile(broken).resize(QFile(broken).size() / 4);
    QSignalSpy failed(&fresh.controller(), &AnalysisController::failed);
    fresh.openPath(broken);
    QVERIFY(failed.wait(20000));
    QCoreApplication::processEvents();
    QVERIFY(heatmapOf(fresh).isEmpty());
    QCOMPARE(fresh.windowTitle(), QString("kvscope"));
    QCOMPARE(promptPageOf(fresh).worstCells().rowCount(), 0);
    QCOMPARE(headTableOf(fresh).rowCount(), 0);
    QCOMPARE(toolbarOf(fresh).promptBox().count(), 0);
    QVERIFY(!fresh.findChild<QTabWidget*>()->isTabEnabled(1));
    QCOMPARE(promptPageOf(fresh).selectedLayer(), -1);
    QVERIFY(!toolbarOf(fresh).isEnabled());
    // Open Recent lists what opened, not what failed.
    QVERIFY(!QSettings().value("recentFiles").toStringList().contains(broken));
    QVERIFY(QSettings().value("recentFiles").toStringList().contains(m_path));
    // The message box and the status bar say what is wrong, each naming the file once.
    bool said = false;
    for (QWidget* w : QApplication::topLevelWidgets())
        if (auto* box = qobject_cast<QMessageBox*>(w); box && box->isVisible()) {
            const QString text = box->text() + "\n" + box->informativeText();
            if (!text.contains(broken))
                continue;  // (another test's)
            QVERIFY2(text.contains("is truncated: it holds") && text.count(broken) == 1, qPrintable(text));
            said = true;
        }
    QVERIFY(said);
    const QString status = fresh.statusBar()->findChild<QLabel*>()->text();
    QVERIFY2(status.contains("is truncated: it holds") && status.count(broken) == 1, qPrintable(status));
    for (QWidget* w : QApplication::topLevelWidgets())  // the message box
        if (w->inherits("QMessageBox"))
            w->close();
}

// A broken file opened over an analysis: the error is shown, and the analysis stays, whole
// and usable (its cells, its title, its toolbar, its recent entry).
void TestOpening::brokenFileKeepsTheOpenAnalysis()
{
    ensureDemoOpen();
    promptPageOf(*m_window).selectCell(5, 50);
    const int worstRows = promptPageOf(*m_window).worstCells().rowCount();
    QVERIFY(worstRows > 0);
    const QString broken = m_dir.filePath("kept.h5");
    QFile::remove(broken);
    QFile::copy(m_path, broken);
    QFile(broken).resize(QFile(broken).size() / 4);
    QSignalSpy failed(&m_window->controller(), &AnalysisController::failed);
    m_window->openPath(broken);
    QVERIFY(failed.wait(20000));
    QCoreApplication::processEvents();
    QVERIFY2(failed.first().first().toString().contains(broken), qPrintable(failed.first().first().toString()));
    // The error is shown: a message box, and the status bar names both files.
    bool box = false;
    for (QWidget* w : QApplication::topLevelWidgets())
        if (w->inherits("QMessageBox") && w->isVisible())
            box = true;
    QVERIFY(box);
    const QString status = m_window->statusBar()->findChild<QLabel*>()->text();
    QVERIFY2(status.contains("kept.h5") && status.contains("demo.h5"), qPrintable(status));
    // The analysis stays.
    QCOMPARE(m_window->controller().path(), m_path);
    QVERIFY(m_window->controller().result());
    QCOMPARE(m_window->windowTitle(), QString("kvscope - demo.h5"));
    QVERIFY(!heatmapOf(*m_window).isEmpty());
    QCOMPARE(heatmapOf(*m_window).grid().rows, 8);
    QCOMPARE(promptPageOf(*m_window).selectedLayer(), 5);
    QCOMPARE(promptPageOf(*m_window).selectedToken(), qint64(50));
    QCOMPARE(promptPageOf(*m_window).worstCells().rowCount(), worstRows);
    QCOMPARE(headTableOf(*m_window).rowCount(), m_reference.prompts[0].heads);
    QVERIFY(toolbarOf(*m_window).isEnabled());
    QCOMPARE(toolbarOf(*m_window).promptBox().count(), int(m_reference.prompts.size()));
    QVERIFY(m_window->findChild<QTabWidget*>()->isTabEnabled(1));
    QVERIFY(!QSettings().value("recentFiles").toStringList().contains(broken));
    // and works: another cell, the other part.
    promptPageOf(*m_window).selectCell(2, 10);
    toolbarOf(*m_window).setPart(KvPart::V);
    QCOMPARE(headTableOf(*m_window).value(1, HeadTableModel::ratioColumn(KvPart::V)),
             headErrorRatio(m_reference.prompts[0], Metric::VLinf, 2, 10, 1));
    toolbarOf(*m_window).setPart(KvPart::K);
    for (QWidget* w : QApplication::topLevelWidgets())
        if (w->inherits("QMessageBox"))
            w->close();
}

// A folder that is not a folder of dumps (opened by mistake): the message says a folder was
// given and what a folder import needs, not which file the importer missed first.
void TestOpening::aFolderGivenByMistakeSaysSo()
{
    const QString folder = m_dir.filePath("not-dumps");
    QDir().mkpath(folder);
    MainWindow window;
    QSignalSpy failed(&window.controller(), &AnalysisController::failed);
    window.openPath(folder);
    QVERIFY(failed.wait(20000));
    const QString message = failed.first().first().toString();
    QVERIFY2(message.contains(folder + ": is a folder"), qPrintable(message));
    for (const char* needed : {"kv_cache_config.json", "prompt.json", "kv_caches_rank", "block_tables.pt", "expected.pt",
                               "docs/import.md"})
        QVERIFY2(message.contains(needed), qPrintable(message));
    for (QWidget* w : QApplication::topLevelWidgets())
        if (w->inherits("QMessageBox"))
            w->close();
}

void TestOpening::cancelKeepsWhatWasAnalysed()
{
    MainWindow window;
    window.resize(1280, 800);
    window.show();
    QSignalSpy cancelled(&window.controller(), &AnalysisController::cancelled);
    QSignalSpy finished(&window.controller(), &AnalysisController::finished);
    // Cancelled by the worker itself after its first layer: the same point on every machine
    // (a cancel from this thread could arrive after the last of 8 small layers).
    AnalysisController& controller = window.controller();
    AnalysisControllerTesting::setLayerHook(controller, [&controller](int) { controller.cancel(); });
    window.openPath(m_path);
    QTRY_VERIFY_WITH_TIMEOUT(cancelled.count() + finished.count() > 0, 60000);
    QCOMPARE(cancelled.count(), 1);
    QCOMPARE(finished.count(), 0);
    const std::vector<char>& ready = controller.readyLayers();
    const int done = int(std::count(ready.begin(), ready.end(), 1));
    QVERIFY(done >= 1);  // one per worker at most: 8 only with 8 or more cores
    // The finished layers are ranked; the others are covered and said to be not analysed.
    QVERIFY(promptPageOf(window).worstCells().rowCount() > 0);
    for (int r = 0; r < promptPageOf(window).worstCells().rowCount(); ++r)
        QVERIFY(ready[std::size_t(promptPageOf(window).worstCells().cell(r).layer)]);
    if (done == 8)
        return;
    int notReady = 0;
    while (ready[std::size_t(notReady)])
        ++notReady;
    QVERIFY(promptPageOf(window).cellTooltip(notReady, 0).contains("not analysed"));
    QTRY_VERIFY_WITH_TIMEOUT(promptPageOf(window).mapUpToDate(), 30000);  // (the map is redrawn off this thread)
    bool covered = false;
    for (int i = 0; i < heatmapOf(window).itemCount(); ++i)
        if (auto* text = qobject_cast<QCPItemText*>(heatmapOf(window).item(i)); text && text->text().contains("cancelled"))
            covered = true;
    QVERIFY(covered);
}

// The file changes under the open window: truncated (a later read fails with a message
// naming it, in the panel that needed it), then replaced by another file (opening it again
// shows the new one). No crash either way.
void TestOpening::bundleTruncatedOrReplacedWhileOpen()
{
    const QString live = m_dir.filePath("live.h5");
    QFile::remove(live);
    QVERIFY(QFile::copy(m_path, live));
    MainWindow window;
    QVERIFY(showAndAnalyse(window, live));
    QVERIFY(QFile(live).resize(QFile(live).size() / 3));
    QSignalSpy histogram(&drillDownOf(window), &DrillDownPanel::histogramShown);
    promptPageOf(window).selectCell(6, 40);  // the drill-down reads this head's values from the file again
    QTRY_VERIFY_WITH_TIMEOUT(histogram.count() > 0, 20000);
    const auto views = window.findChildren<HistogramView*>();
    QVERIFY(!views.isEmpty());
    const QString message = views.first()->message();
    QVERIFY2(message.startsWith("no histogram") && message.contains(live), qPrintable(message));

    // Replaced: a new file under the same name (as a writer's rename does).
    const QString next = m_dir.filePath("next.h5");
    QFile::remove(next);
    QVERIFY(QFile::copy(m_path, next));
    QVERIFY(std::rename(next.toUtf8().constData(), live.toUtf8().constData()) == 0);
    QVERIFY(showAndAnalyse(window, live));
    QCOMPARE(window.controller().result()->prompts.size(), m_reference.prompts.size());
}

// A folder import runs a child process: cancelling kills it, and so does closing the window,
// at once (the stand-in helper would take 60 s).
void TestOpening::importCanBeCancelledAndClosed()
{
    const QString helper = m_dir.filePath("slow-import.sh");
    QFile script(helper);
    QVERIFY(script.open(QIODevice::WriteOnly));
    script.write("#!/bin/sh\nsleep 60\n");
    script.close();
    script.setPermissions(QFileDevice::ReadOwner | QFileDevice::ExeOwner);
    qputenv("KVSCOPE_IMPORT_HELPER", helper.toUtf8());
    const QString folder = m_dir.filePath("dumps");
    QDir().mkpath(folder);
    QFile config(QDir(folder).filePath("kv_cache_config.json"));  // a folder of dumps, as far as the app looks
    QVERIFY(config.open(QIODevice::WriteOnly));
    config.close();
    QElapsedTimer clock;
    clock.start();
    {
        MainWindow window;
        QSignalSpy cancelled(&window.controller(), &AnalysisController::cancelled);
        window.openPath(folder);
        QTest::qWait(300);  // the helper is running
        QVERIFY(window.controller().isRunning());
        window.controller().cancel();
        QVERIFY(cancelled.wait(10000));
        QVERIFY(!window.controller().isRunning());
        window.openPath(folder);
        QTest::qWait(300);
    }  // closed while importing
    qunsetenv("KVSCOPE_IMPORT_HELPER");
    QVERIFY2(clock.elapsed() < 20000, "closing waited for the import");
}

// A second open() while the first bundle is still analysing: the first run is dropped, the
// second one's results are the ones shown, and nothing of the first arrives later.
void TestOpening::secondBundleWhileTheFirstAnalyses()
{
    const QString other = m_dir.filePath("other.h5");
    if (!QFileInfo::exists(other)) {
        SyntheticCaptureOptions options = demoCaptureOptions();
        options.faultLayer = -1;  // a different bundle: no fault
        writeSyntheticCapture(other.toStdString(), options);
    }
    MainWindow window;
    QSignalSpy opened(&window.controller(), &AnalysisController::opened);
    QSignalSpy finished(&window.controller(), &AnalysisController::finished);
    AnalysisController& controller = window.controller();
    // After the first bundle's first layer, its worker waits until this thread has opened the
    // second bundle: the first run is certainly still going when it does.
    std::atomic<bool> reached = false;  // the hook runs on every analysis worker
    std::promise<void> opened2;
    std::shared_future<void> secondOpened = opened2.get_future().share();
    AnalysisControllerTesting::setLayerHook(controller, [&reached, secondOpened](int) {
        if (!reached.exchange(true))
            secondOpened.wait();
    });
    window.openPath(m_path);
    QTRY_VERIFY_WITH_TIMEOUT(reached, 60000);
    AnalysisControllerTesting::setLayerHook(controller, {});
    window.openPath(other);
    opened2.set_value();
    QTRY_VERIFY_WITH_TIMEOUT(finished.count() == 1, 60000);
    QTest::qWait(200);  // anything the first run still posted would arrive now
    QCOMPARE(finished.count(), 1);
    QCOMPARE(controller.path(), other);
    QCOMPARE(opened.last().first().toString(), other);
    const AnalysisResult expected = analyzeBundle(std::make_shared<BundleReader>(other.toStdString()));
    const PromptAnalysis& shown = controller.result()->prompts.at(0);
    for (int m = 0; m < kMetricCount; ++m)
        QVERIFY(std::memcmp(shown.metrics[std::size_t(m)].data(), expected.prompts[0].metrics[std::size_t(m)].data(),
                            shown.metrics[std::size_t(m)].size() * sizeof(float)) == 0);
}

// libhdf5 crashing on a file (a segmentation fault inside the library, simulated here in the
// child that opens every bundle first) is a message naming the file; the window lives on.
void TestOpening::hdf5CrashIsAMessage()
{
    if (!BundleReader::kProbeFromThreads)
        QSKIP("no probe child in the app under ThreadSanitizer or AddressSanitizer (no fork() with threads there)");
    MainWindow window;
    QSignalSpy failed(&window.controller(), &AnalysisController::failed);
    AnalysisControllerTesting::setProbeHook(window.controller(), [] { std::raise(SIGSEGV); });
    window.openPath(m_path);
    QVERIFY(failed.wait(20000));
    const QString message = failed.first().first().toString();
    QVERIFY2(message.contains(m_path) && message.contains("crashed the HDF5 library"), qPrintable(message));
    AnalysisControllerTesting::setProbeHook(window.controller(), {});
    QSignalSpy finished(&window.controller(), &AnalysisController::finished);
    window.openPath(m_path);
    QVERIFY(finished.wait(60000));
}

// NEWBODIES

void TestOpening::resultsFileOpensAtOnce()
{
    // File > Save results, then the results file opened: no analysis runs; its map shows every
    // row from the file before any of its arrays is read (they follow a layer at a time); the
    // analysis is the bundle's; without the bundle, the views that need its KV are off and say why.
    const QString bundle = m_dir.filePath("saved.h5"), results = m_dir.filePath("saved.kvres");
    QFile::copy(m_path, bundle);
    QSignalSpy finished(&m_window->controller(), &AnalysisController::finished);
    m_window->openPath(bundle);
    QVERIFY(finished.wait(60000));
    std::promise<QString> saved;
    m_window->controller().saveResults(results, [&saved](const QString& error) { saved.set_value(error); });
    auto done = saved.get_future();
    QTRY_VERIFY_WITH_TIMEOUT(done.wait_for(std::chrono::seconds(0)) == std::future_status::ready, 30000);
    QCOMPARE(done.get(), QString());
    const auto json = [](const AnalysisResult& r) {
        std::ostringstream out;
        writeAnalysisJson(r, out);
        return out.str();
    };
    for (bool bundleThere : {true, false}) {
        if (!bundleThere)
            QVERIFY(QFile::remove(bundle));
        QSignalSpy layers(&m_window->controller(), &AnalysisController::layerFinished);
        QSignalSpy opened(&m_window->controller(), &AnalysisController::opened);
        PromptPage& page = *m_window->findChild<PromptPage*>();
        QSignalSpy mapShown(&page, &PromptPage::mapShown);
        std::promise<void> release;
        std::shared_future<void> released = release.get_future().share();
        AnalysisControllerTesting::setLayerHook(m_window->controller(), [released](int) { released.wait(); });  // the arrays wait
        auto releaseOnFailure = qScopeGuard([&release] {
            try {
                release.set_value();
            } catch (const std::future_error&) {  // released already
            }
        });
        m_window->openPath(results);
        QTRY_VERIFY_WITH_TIMEOUT(mapShown.count() > 0, 30000);
        QVERIFY(page.showsStoredMap());
        QCOMPARE(layers.count(), 0);
        const HeatmapGrid& shown = page.heatmap().grid();
        QCOMPARE(shown.rows, int(m_reference.prompts.front().layers.size()));
        for (int row = 0; row < shown.rows; ++row) {
            bool any = false;
            for (std::int64_t c = 0; c < shown.columns; ++c)
                any = any || std::isfinite(shown.at(row, c));
            QVERIFY2(any, qPrintable(QString("row %1 of the stored map is empty").arg(row)));
        }
        releaseOnFailure.dismiss();
        release.set_value();
        QVERIFY(finished.wait(30000));
        AnalysisControllerTesting::setLayerHook(m_window->controller(), {});
        QCOMPARE(opened.count(), 1);
        QCOMPARE(layers.count(), shown.rows);  // read, a layer at a time
        QVERIFY(std::all_of(m_window->controller().readyLayers().begin(), m_window->controller().readyLayers().end(),
                            [](char ready) { return ready; }));
        AnalysisResult expected = m_reference;
        expected.bundle = bundle.toStdString();
        QCOMPARE(json(*m_window->controller().result()), json(expected));
        QTabWidget& tabs = *m_window->findChild<QTabWidget*>();
        QCOMPARE(tabs.isTabEnabled(2), bundleThere);  // What if
        QCOMPARE(tabs.isTabEnabled(3), bundleThere);  // Compare
        const QString status = m_window->statusBar()->findChild<QLabel*>()->text();
        QVERIFY2(status.contains("views that need the KV are off") != bundleThere, qPrintable(status));
        const PromptAnalysis& p = m_window->controller().result()->prompts.front();
        QString error = "pending";
        m_window->controller().requestHeadHistogram(p.id, p.layers.front(), 0, KvPart::K, 0, p.tokens,
                                                    [&error](auto, const QString& e) { error = e; });
        QTRY_VERIFY_WITH_TIMEOUT(error != "pending", 30000);
        QVERIFY2(error.isEmpty() == bundleThere, qPrintable(error));
        if (!bundleThere)
            QVERIFY2(error.contains("not at hand"), qPrintable(error));
    }
    // File > Locate bundle...: another file is refused and says why; the bundle, moved, turns
    // every view on.
    QSignalSpy located(&m_window->controller(), &AnalysisController::bundleLocated);
    const QString other = m_dir.filePath("other.h5"), moved = m_dir.filePath("moved/saved.h5");
    SyntheticCaptureOptions small = demoCaptureOptions();
    small.layers = 2;
    writeSyntheticCapture(other.toStdString(), small);
    m_window->controller().locateBundle(other);
    QVERIFY(located.wait(30000));
    QVERIFY2(m_window->controller().bundleMissing().contains("is not the bundle analysed"),
             qPrintable(m_window->controller().bundleMissing()));
    QTabWidget& tabs = *m_window->findChild<QTabWidget*>();
    QVERIFY(!tabs.isTabEnabled(2));
    QVERIFY(QDir(m_dir.path()).mkpath("moved"));
    QVERIFY(QFile::copy(m_path, moved));
    m_window->controller().locateBundle(moved);
    QVERIFY(located.wait(30000));
    QCOMPARE(m_window->controller().bundleMissing(), QString());
    QVERIFY(tabs.isTabEnabled(2) && tabs.isTabEnabled(3));
    const QString status = m_window->statusBar()->findChild<QLabel*>()->text();
    QVERIFY2(status.contains("found"), qPrintable(status));
    const PromptAnalysis& p = m_window->controller().result()->prompts.front();
    QString error = "pending";
    m_window->controller().requestHeadHistogram(p.id, p.layers.front(), 0, KvPart::K, 0, p.tokens,
                                                [&error](auto, const QString& e) { error = e; });
    QTRY_VERIFY_WITH_TIMEOUT(error != "pending", 30000);
    QVERIFY2(error.isEmpty(), qPrintable(error));
}

// The demo's window opens at once: the capture is made by a child meanwhile (openMade), and
// Cancel kills it, leaving nothing open; made, it is opened and analysed.
void TestOpening::aBundleMadeFirstOpensWhenMade()
{
    const QString made = m_dir.filePath("made.h5");
    QSignalSpy finished(&m_window->controller(), &AnalysisController::finished);
    QSignalSpy cancelled(&m_window->controller(), &AnalysisController::cancelled);
    QSignalSpy progress(&m_window->controller(), &AnalysisController::progress);
    m_window->controller().openMade(made, {"/bin/sh", "-c", "sleep 30; cp \"$0\" \"$1\"", m_path.toStdString(), made.toStdString()},
                                    "making the test's capture");
    QTRY_VERIFY_WITH_TIMEOUT(!progress.isEmpty(), 10000);
    QCOMPARE(progress.first().at(2).toString(), QString("making the test's capture"));
    QElapsedTimer took;
    took.start();
    m_window->controller().cancel();
    QVERIFY(cancelled.wait(10000));
    QVERIFY(took.elapsed() < 10000);  // the child was killed, not waited for
    QVERIFY(!QFileInfo::exists(made));
    m_window->controller().openMade(made, {"/bin/sh", "-c", "cp \"$0\" \"$1\"", m_path.toStdString(), made.toStdString()},
                                    "making the test's capture");
    QVERIFY(finished.wait(60000));
    QCOMPARE(m_window->controller().path(), made);
    QCOMPARE(m_window->controller().result()->prompts.size(), m_reference.prompts.size());
    // A maker that fails: its message, naming the file.
    QSignalSpy failed(&m_window->controller(), &AnalysisController::failed);
    const QString never = m_dir.filePath("never.h5");
    m_window->controller().openMade(never, {"/bin/sh", "-c", "echo 'no room on the disk' >&2; exit 3"}, "making");
    QVERIFY(failed.wait(30000));
    QVERIFY2(failed.first().first().toString().contains("never.h5") &&
                 failed.first().first().toString().contains("no room on the disk"),
             qPrintable(failed.first().first().toString()));
}

// A layer analysed in windows of tokens (a long context's) shows the start of its row as each
// window is done, the rest covered, before the layer is: the first cells of a 128k-token bundle
// show within a window's time, not a layer's. What it shows is what the finished layer has.
void TestOpening::longLayerFillsAsItIsAnalysed()
{
    MainWindow window;
    window.resize(1280, 800);
    window.show();
    AnalysisController& controller = window.controller();
    AnalysisControllerTesting::setWindowTokens(controller, 16);
    // The worker waits after the first windows of the first layer until the page follows a map
    // (they may be done before the opened bundle reaches the page), then after the third (the
    // demo's first layer slides: its first tokens have left the window) until this thread has looked.
    std::atomic<qint64> heldAt = 0;
    std::promise<void> following, looked;
    std::shared_future<void> followingNow = following.get_future().share(), lookedAt = looked.get_future().share();
    AnalysisControllerTesting::setWindowHook(controller, [&heldAt, followingNow, lookedAt](int layer, qint64 tokens) {
        if (layer != 0 || heldAt != 0)
            return;
        if (tokens < 48) {
            followingNow.wait();
            return;
        }
        heldAt = tokens;
        lookedAt.wait();
    });
    auto release = qScopeGuard([&following, &looked] {  // a failed check leaves no worker waiting
        for (std::promise<void>* gate : {&following, &looked})
            try {
                gate->set_value();
            } catch (const std::future_error&) {  // opened already
            }
    });
    QSignalSpy opened(&controller, &AnalysisController::opened);
    QSignalSpy finished(&controller, &AnalysisController::finished);
    PromptPage& page = promptPageOf(window);
    window.openPath(m_path);
    QTRY_VERIFY_WITH_TIMEOUT(opened.count() == 1, 60000);
    QCoreApplication::processEvents();  // the page follows the first prompt's map
    following.set_value();
    QTRY_VERIFY_WITH_TIMEOUT(heldAt > 0 && page.rowStartShown() == heldAt && page.mapUpToDate(), 60000);
    QVERIFY(!controller.layerReady(0));
    const HeatmapGrid during = heatmapOf(window).grid();
    // (in floors over layer 0's off threshold, which the layers finished since may move)
    const std::vector<double> thresholdDuring = page.offThresholds();
    bool covered = false;  // the first row from the tokens not analysed yet, the rest of the rows whole
    for (int i = 0; i < heatmapOf(window).itemCount(); ++i)
        if (auto* rect = qobject_cast<QCPItemRect*>(heatmapOf(window).item(i)))
            covered = covered || (rect->topLeft->coords().y() < 0 && rect->bottomRight->coords().y() < 1 &&
                                  rect->topLeft->coords().x() == double(heldAt) - 0.5);
    QVERIFY(covered);
    release.dismiss();
    looked.set_value();
    const qint64 analysed = heldAt;
    QTRY_VERIFY_WITH_TIMEOUT(finished.count() == 1 && page.mapUpToDate(), 60000);
    const HeatmapGrid after = heatmapOf(window).grid();
    const std::vector<double> thresholdAfter = page.offThresholds();
    QCOMPARE(thresholdDuring.empty(), thresholdAfter.empty());
    const auto inFloors = [](float v, const std::vector<double>& thresholds) {
        return thresholds.empty() ? double(v) : double(v) * thresholds[0];
    };
    QCOMPARE(after.tokensPerColumn, during.tokensPerColumn);
    QCOMPARE(after.firstToken, during.firstToken);
    int shown = 0, notYet = 0;
    for (qint64 c = 0; c < during.columns; ++c) {
        const qint64 first = during.firstToken + c * during.tokensPerColumn, end = first + during.tokensPerColumn;
        const float value = during.at(0, c);
        if (end <= analysed) {  // the windows done then: as the finished analysis has it
            const double shownThen = inFloors(value, thresholdDuring), atTheEnd = inFloors(after.at(0, c), thresholdAfter);
            QVERIFY2(std::isnan(shownThen) ? std::isnan(atTheEnd) : std::abs(shownThen - atTheEnd) <= 1e-5 * std::abs(atTheEnd),
                     qPrintable(QString("column %1: %2 shown, %3 at the end").arg(c).arg(shownThen).arg(atTheEnd)));
            shown += !std::isnan(value);
        } else if (first >= analysed) {  // not analysed then
            QVERIFY2(std::isnan(value), qPrintable(QString("column %1 shows %2 before it was analysed").arg(c).arg(value)));
            notYet += !std::isnan(after.at(0, c));
        }
    }
    QVERIFY(shown > 0);
    QVERIFY(notYet > 0);
}

// A viewer registered with the controller (as every page is) is told, in order, what happens
// to the open capture, before the controller's own signals.
void TestOpening::viewersAreToldInOrder()
{
    struct Recorder : CaptureViewer {
        QStringList events;
        void captureOpening(const QString& path, bool) override { events << "opening " + QFileInfo(path).fileName(); }
        void captureOpened() override { events << "opened"; }
        void layerAnalysed(int layer) override { events << QString("layer %1").arg(layer); }
        void captureAnalysed() override { events << "analysed"; }
        void openingStopped(const QString&, const QString& error) override { events << "stopped: " + error.left(20); }
        void captureClosed(const QString&) override { events << "closed"; }
    };
    MainWindow window;
    Recorder recorder;
    window.controller().addViewer(&recorder);
    bool signalAfterViewer = false;
    connect(&window.controller(), &AnalysisController::finished, this,
            [&] { signalAfterViewer = recorder.events.last() == "analysed"; });
    QVERIFY(showAndAnalyse(window, m_path));
    QVERIFY(signalAfterViewer);
    QCOMPARE(recorder.events.first(), "opening " + QFileInfo(m_path).fileName());
    QCOMPARE(recorder.events.at(1), QString("opened"));
    QCOMPARE(recorder.events.last(), QString("analysed"));
    QStringList layers = recorder.events.mid(2, recorder.events.size() - 3);
    QCOMPARE(layers.size(), 8);
    layers.sort();
    for (int l = 0; l < 8; ++l)
        QCOMPARE(layers.at(l), QString("layer %1").arg(l));
    // A file that is not a bundle: it never opens, and the analysis on screen stays.
    const QString junk = m_dir.filePath("junk.h5");
    QFile file(junk);
    QVERIFY(file.open(QIODevice::WriteOnly));
    file.write("not hdf5");
    file.close();
    recorder.events.clear();
    QSignalSpy failed(&window.controller(), &AnalysisController::failed);
    window.openPath(junk);
    QVERIFY(failed.wait(30000));
    QCOMPARE(recorder.events.size(), 2);
    QCOMPARE(recorder.events.at(0), QString("opening junk.h5"));
    QVERIFY2(recorder.events.at(1).startsWith("stopped: ") && recorder.events.at(1).size() > 9, qPrintable(recorder.events.at(1)));
    QVERIFY(window.controller().result());
}

// File > Export view > HTML report: written by kvscope-app in a child process through the
// door, while this thread goes on; a folder that cannot be written is a message naming it.
void TestOpening::reportIsWrittenOffTheGuiThread()
{
    MainWindow window;
    QVERIFY(showAndAnalyse(window, m_path));
    int ticks = 0;
    QTimer ticker;
    connect(&ticker, &QTimer::timeout, this, [&ticks] { ++ticks; });
    ticker.start(10);
    const QString folder = m_dir.filePath("report");
    std::optional<std::pair<QString, QString>> done;
    window.controller().writeReport(folder, false, [&done](const QString& html, const QString& error) { done = {html, error}; });
    QTRY_VERIFY_WITH_TIMEOUT(done.has_value(), 120000);
    QVERIFY2(done->second.isEmpty(), qPrintable(done->second));
    QCOMPARE(done->first, QDir(folder).filePath("report.html"));
    QFile html(done->first);
    QVERIFY(html.open(QIODevice::ReadOnly));
    QVERIFY(html.readAll().contains(QFileInfo(m_path).fileName().toUtf8()));
    QVERIFY(ticks > 0);  // the event loop ran while the report was written
    // Into a file, not a folder.
    const QString blocked = m_dir.filePath("a-file");
    QFile blocker(blocked);
    QVERIFY(blocker.open(QIODevice::WriteOnly));
    blocker.close();
    done.reset();
    window.controller().writeReport(blocked, false, [&done](const QString& html, const QString& error) { done = {html, error}; });
    QTRY_VERIFY_WITH_TIMEOUT(done.has_value(), 120000);
    QVERIFY(done->first.isEmpty());
    QVERIFY2(done->second.contains(blocked), qPrintable(done->second));
}

QTEST_MAIN(TestOpening)
#include "tst_gui_opening.moc"
