// The one door from the GUI to the engine (gui/engine_door.h): a request runs off the GUI
// thread and delivers on it; a newer request of its tag cancels the one running and replaces
// the one queued; cancel() lets the running one still deliver, drop() silences it; a
// receiver that is gone gets nothing; destruction waits for what runs.

#include "gui/engine_door.h"

#include <QCoreApplication>
#include <QSignalSpy>
#include <QTest>
#include <QThread>

#include <chrono>
#include <future>
#include <thread>

using namespace kvscope;

class TestEngineDoor : public QObject {
    Q_OBJECT

private slots:
    void deliversOnTheGuiThreadInOrder();
    void aNewerRequestReplacesTheQueuedOne();
    void tagsRunSideBySide();
    void cancelStillDeliversDropDoesNot();
    void aGoneReceiverGetsNothing();
    void progressNamesItsTag();
    void destructionWaitsForWhatRuns();
};

namespace {

// Spins on the worker until the request is cancelled (or a minute passes: the test then fails).
void waitForCancel(const EngineJob& job)
{
    const auto until = std::chrono::steady_clock::now() + std::chrono::minutes(1);
    while (!job.cancelled() && std::chrono::steady_clock::now() < until)
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
}

}  // namespace

void TestEngineDoor::deliversOnTheGuiThreadInOrder()
{
    QObject owner;
    EngineDoor door(&owner);
    std::vector<int> seen;
    bool workOffGui = false, deliveredOnGui = true;
    QThread* gui = QThread::currentThread();
    door.ask("t", &owner, [&](EngineJob& job) {
        workOffGui = QThread::currentThread() != gui;
        for (int i = 0; i < 5; ++i)
            job.deliver([&, i] {
                deliveredOnGui = deliveredOnGui && QThread::currentThread() == gui;
                seen.push_back(i);
            });
    });
    QVERIFY(door.busy("t"));
    QTRY_VERIFY_WITH_TIMEOUT(!door.busy("t"), 30000);
    QVERIFY(workOffGui);
    QVERIFY(deliveredOnGui);
    QCOMPARE(seen, (std::vector<int>{0, 1, 2, 3, 4}));
}

void TestEngineDoor::aNewerRequestReplacesTheQueuedOne()
{
    QObject owner;
    EngineDoor door(&owner);
    std::vector<QString> ran, delivered;
    std::promise<void> firstRunning;
    bool firstSawCancel = false;
    door.ask("t", &owner, [&](EngineJob& job) {
        firstRunning.set_value();
        waitForCancel(job);
        firstSawCancel = job.cancelled();
        job.deliver([&] { delivered.push_back("first"); });  // replaced: dropped
    });
    firstRunning.get_future().wait();
    for (const QString name : {"second", "third"})
        door.ask("t", &owner, [&ran, &delivered, name](EngineJob& job) {
            ran.push_back(name);  // (one at a time: the lane runs one request)
            job.deliver([&delivered, name] { delivered.push_back(name); });
        });
    QTRY_VERIFY_WITH_TIMEOUT(!door.busy("t"), 30000);
    QVERIFY(firstSawCancel);
    QCOMPARE(ran, (std::vector<QString>{"third"}));
    QCOMPARE(delivered, (std::vector<QString>{"third"}));
}

void TestEngineDoor::tagsRunSideBySide()
{
    QObject owner;
    EngineDoor door(&owner);
    std::promise<void> otherRan;
    std::shared_future<void> other = otherRan.get_future().share();
    bool sawOther = false;
    door.ask("a", &owner, [&](EngineJob&) { sawOther = other.wait_for(std::chrono::minutes(1)) == std::future_status::ready; });
    door.ask("b", &owner, [&](EngineJob&) { otherRan.set_value(); });
    QTRY_VERIFY_WITH_TIMEOUT(!door.busy("a") && !door.busy("b"), 70000);
    QVERIFY(sawOther);
}

void TestEngineDoor::cancelStillDeliversDropDoesNot()
{
    QObject owner;
    EngineDoor door(&owner);
    for (bool drop : {false, true}) {
        std::promise<void> running;
        bool delivered = false;
        door.ask("t", &owner, [&](EngineJob& job) {
            running.set_value();
            waitForCancel(job);
            job.deliver([&] { delivered = job.cancelled(); });
        });
        running.get_future().wait();
        if (drop)
            door.drop("t");
        else
            door.cancel("t");
        QTRY_VERIFY_WITH_TIMEOUT(!door.busy("t"), 30000);
        QCOMPARE(delivered, !drop);
    }
}

void TestEngineDoor::aGoneReceiverGetsNothing()
{
    QObject owner;
    EngineDoor door(&owner);
    auto* receiver = new QObject;
    std::promise<void> receiverGone;
    std::shared_future<void> gone = receiverGone.get_future().share();
    bool delivered = false;
    door.ask("t", receiver, [&](EngineJob& job) {
        gone.wait();
        job.deliver([&] { delivered = true; });
    });
    delete receiver;
    receiverGone.set_value();
    QTRY_VERIFY_WITH_TIMEOUT(!door.busy("t"), 30000);
    QVERIFY(!delivered);
}

void TestEngineDoor::progressNamesItsTag()
{
    QObject owner;
    EngineDoor door(&owner);
    QSignalSpy progress(&door, &EngineDoor::progress);
    door.ask("reading", &owner, [](EngineJob& job) { job.progress(3, 7, "layers"); });
    QTRY_VERIFY_WITH_TIMEOUT(!door.busy("reading"), 30000);
    QCOMPARE(progress.count(), 1);
    const QList<QVariant> args = progress.first();
    QCOMPARE(args.at(0).toString(), QString("reading"));
    QCOMPARE(args.at(1).toInt(), 3);
    QCOMPARE(args.at(2).toInt(), 7);
    QCOMPARE(args.at(3).toString(), QString("layers"));
}

void TestEngineDoor::destructionWaitsForWhatRuns()
{
    std::atomic<bool> finished = false, sawCancel = false;
    std::promise<void> running;
    {
        QObject owner;
        EngineDoor door(&owner);
        door.ask("t", &owner, [&](EngineJob& job) {
            running.set_value();
            waitForCancel(job);
            sawCancel = job.cancelled();
            finished = true;
        });
        running.get_future().wait();
    }
    QVERIFY(finished);
    QVERIFY(sawCancel);
}

QTEST_GUILESS_MAIN(TestEngineDoor)
#include "tst_engine_door.moc"
