// Another executable run beside kvscope (util/child_process.h): its exit code, signal and
// standard error come back as they were; standard output goes nowhere; Cancel kills it with
// everything it started; a program that cannot be started is an error naming it.

#include "util/child_process.h"

#include <QDir>
#include <QTest>

#include <atomic>
#include <chrono>
#include <fstream>
#include <stdexcept>
#include <string>
#include <thread>

#include <csignal>
#include <unistd.h>

using namespace kvscope;

class TestChildProcess : public QObject {
    Q_OBJECT

private slots:
    void exitCodeAndMessages();
    void aSignalIsReported();
    void plentyOfOutputDoesNotBlock();
    void cancelKillsWhatItStarted();
    void aMissingProgramIsAnError();
};

namespace {

ChildExit shell(const std::string& script, const std::atomic<bool>* cancel = nullptr)
{
    return runChildProcess({"/bin/sh", "-c", script}, cancel);
}

// A process that is gone (or only a zombie nobody reaped yet).
bool gone(pid_t pid)
{
    std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
    std::string pidText, name, state;
    if (!(stat >> pidText >> name >> state))
        return true;
    return state == "Z" || state == "X";
}

}  // namespace

void TestChildProcess::exitCodeAndMessages()
{
    const ChildExit ok = shell("echo to-stdout; exit 0");
    QVERIFY(!ok.cancelled);
    QCOMPARE(ok.signal, 0);
    QCOMPARE(ok.exitCode, 0);
    QCOMPARE(ok.messages, std::string());  // standard output is not kept
    const ChildExit failed = shell("printf 'file.h5: /kv: broken\\n\\n' >&2; exit 3");
    QCOMPARE(failed.exitCode, 3);
    QCOMPARE(failed.messages, std::string("file.h5: /kv: broken"));  // trailing newlines cut
}

void TestChildProcess::aSignalIsReported()
{
    const ChildExit crashed = shell("echo dying >&2; kill -SEGV $$");
    QCOMPARE(crashed.signal, SIGSEGV);
    QCOMPARE(crashed.messages, std::string("dying"));
}

void TestChildProcess::plentyOfOutputDoesNotBlock()
{
    // 4 MB on each stream: more than a pipe holds; standard error is kept up to 64 KiB.
    const ChildExit loud = shell("head -c 4000000 /dev/zero | tr '\\0' x; head -c 4000000 /dev/zero | tr '\\0' y >&2");
    QCOMPARE(loud.exitCode, 0);
    QVERIFY(loud.messages.size() >= 65536 && loud.messages.size() < 65536 + 4096);
    QVERIFY(loud.messages.find_first_not_of('y') == std::string::npos);
}

void TestChildProcess::cancelKillsWhatItStarted()
{
    const std::string pidFile = QDir::temp().filePath(QString("kvscope-child-%1.pid").arg(getpid())).toStdString();
    std::remove(pidFile.c_str());
    std::atomic<bool> cancel = false;
    std::thread canceller([&] {
        // once the grandchild is there
        for (int i = 0; i < 3000 && !std::ifstream(pidFile).good(); ++i)
            std::this_thread::sleep_for(std::chrono::milliseconds(10));
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
        cancel = true;
    });
    const auto start = std::chrono::steady_clock::now();
    const ChildExit exit = shell("sleep 60 & echo $! > " + pidFile + "; wait", &cancel);
    canceller.join();
    QVERIFY(exit.cancelled);
    QVERIFY(std::chrono::steady_clock::now() - start < std::chrono::seconds(30));
    pid_t grandchild = 0;
    QVERIFY(std::ifstream(pidFile) >> grandchild);
    QTRY_VERIFY_WITH_TIMEOUT(gone(grandchild), 10000);
    std::remove(pidFile.c_str());
}

void TestChildProcess::aMissingProgramIsAnError()
{
    try {
        runChildProcess({"/nonexistent/kvscope-helper", "x"});
        QFAIL("no error");
    } catch (const std::runtime_error& e) {
        QVERIFY2(std::string(e.what()).find("/nonexistent/kvscope-helper") != std::string::npos, e.what());
    }
}

QTEST_GUILESS_MAIN(TestChildProcess)
#include "tst_child_process.moc"
