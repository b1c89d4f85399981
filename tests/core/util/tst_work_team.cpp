// The team that runs a layer's chunks together: every task once, a member never running two
// tasks at once, posted work done within the next run, the first failure reported.

#include "util/work_team.h"

#include <QTest>

#include <atomic>
#include <chrono>
#include <stdexcept>
#include <thread>
#include <vector>

using namespace kvscope;

class TestWorkTeam : public QObject {
    Q_OBJECT

private slots:
    void everyTaskRunsOnceOnItsOwnMember();
    void postedWorkRunsBesideTheNextRun();
    void aFailureIsRethrownAndTheTeamGoesOn();
    void aTeamOfOneRunsInTheCaller();
};

void TestWorkTeam::everyTaskRunsOnceOnItsOwnMember()
{
    WorkTeam team(3);
    QCOMPARE(team.size(), 3);
    for (int round = 0; round < 20; ++round) {  // the same team, run after run
        const int count = 1 + round * 13;
        std::vector<std::atomic<int>> runs(static_cast<std::size_t>(count));
        std::vector<std::atomic<int>> busy(3);  // tasks running per member right now
        std::atomic<bool> overlap{false};
        team.run(count, [&](int index, int member) {
            QVERIFY(member >= 0 && member < 3);
            if (busy[std::size_t(member)]++ != 0)
                overlap = true;
            ++runs[std::size_t(index)];
            std::this_thread::sleep_for(std::chrono::microseconds(index % 3 * 50));
            --busy[std::size_t(member)];
        });
        QVERIFY(!overlap);
        for (const auto& r : runs)
            QCOMPARE(r.load(), 1);
    }
}

void TestWorkTeam::postedWorkRunsBesideTheNextRun()
{
    WorkTeam team(2);
    // Posted work that takes a while: a helper takes it, and runs go on beside it (the caller
    // runs their tasks alone meanwhile); waitPosted() returns once it is done.
    std::atomic<bool> postedDone{false};
    std::atomic<int> duringPosted{0};
    const auto caller = std::this_thread::get_id();
    std::atomic<bool> postedOnHelper{false};
    team.post([&] {
        postedOnHelper = std::this_thread::get_id() != caller;
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
        postedDone = true;
    });
    for (int round = 0; round < 3; ++round)
        team.run(10, [&](int, int) {
            if (!postedDone)
                ++duringPosted;
            std::this_thread::sleep_for(std::chrono::milliseconds(1));
        });
    QVERIFY(duringPosted > 0);
    team.waitPosted();
    QVERIFY(postedDone);
    QVERIFY(postedOnHelper);
    // A failure in posted work comes out of waitPosted(), once.
    team.post([] { throw std::runtime_error("posted failed"); });
    QVERIFY_THROWS_EXCEPTION(std::runtime_error, team.waitPosted());
    team.waitPosted();
}

void TestWorkTeam::aFailureIsRethrownAndTheTeamGoesOn()
{
    WorkTeam team(2);
    std::atomic<int> started{0};
    bool thrown = false;
    try {
        team.run(1000, [&](int index, int) {
            ++started;
            if (index == 3)
                throw std::runtime_error("task 3 failed");
            std::this_thread::sleep_for(std::chrono::microseconds(200));
        });
    } catch (const std::runtime_error& e) {
        thrown = QByteArray(e.what()) == "task 3 failed";
    }
    QVERIFY(thrown);
    QVERIFY(started < 1000);  // the tasks not started were skipped
    std::atomic<int> after{0};
    team.run(10, [&](int, int) { ++after; });
    QCOMPARE(after.load(), 10);
}

void TestWorkTeam::aTeamOfOneRunsInTheCaller()
{
    WorkTeam team(1);
    QCOMPARE(team.size(), 1);
    const auto caller = std::this_thread::get_id();
    bool elsewhere = false;
    int order = 0;
    bool inOrder = true;
    team.run(5, [&](int index, int member) {
        elsewhere = elsewhere || std::this_thread::get_id() != caller || member != 0;
        inOrder = inOrder && order++ == index;
    });
    // With no helper, posted work waits for waitPosted(), which runs it here.
    team.post([&] {
        elsewhere = elsewhere || std::this_thread::get_id() != caller;
        inOrder = inOrder && order++ == 5;
    });
    QCOMPARE(order, 5);
    team.waitPosted();
    QCOMPARE(order, 6);
    QVERIFY(!elsewhere);
    QVERIFY(inOrder);
}

QTEST_APPLESS_MAIN(TestWorkTeam)
#include "tst_work_team.moc"
