// Result arrays too large for memory live in temporary files (util/spillable_array.h): their
// values are the same as in memory through copies, moves and releases; a release gives the
// pages back (the process's resident file pages drop); nothing is left in the directory; and a
// directory that cannot take the file is an error that names it.

#include "util/spillable_array.h"

#include <QTemporaryDir>
#include <QTest>

#include <cmath>
#include <cstdint>
#include <fstream>
#include <string>

using namespace kvscope;

namespace {

// The process's resident pages of mapped files, in KiB (/proc/self/status RssFile + RssShmem).
std::int64_t residentFileKib()
{
    std::ifstream status("/proc/self/status");
    std::string key;
    std::int64_t total = 0;
    while (status >> key) {
        std::int64_t kib = 0;
        if (key == "RssFile:" || key == "RssShmem:") {
            status >> kib;
            total += kib;
        }
        status.ignore(1 << 20, '\n');
    }
    return total;
}

float valueAt(std::size_t i)
{
    return float(i % 9973) * 0.25f - 7.0f;
}

}  // namespace

class TestSpillableArray : public QObject {
    Q_OBJECT

private slots:
    void filledAndWrittenAsInMemory();
    void releaseGivesPagesBackAndKeepsValues();
    void copiesAndMovesKeepTheirKind();
    void anUnusableDirectoryIsNamed();
};

void TestSpillableArray::filledAndWrittenAsInMemory()
{
    QTemporaryDir dir;
    for (const std::string& spill : {std::string(), dir.path().toStdString()}) {
        SpillableArray a;
        a.assign(1'000'003, std::nanf(""), spill);  // not a whole number of pages
        QCOMPARE(a.spilled(), !spill.empty());
        QCOMPARE(a.size(), std::size_t(1'000'003));
        QVERIFY(std::isnan(a[0]) && std::isnan(a[a.size() - 1]));
        for (std::size_t i = 0; i < a.size(); i += 7)
            a[i] = valueAt(i);
        a.release(0, a.size());
        for (std::size_t i = 0; i < a.size(); ++i)
            if (i % 7 == 0 ? a[i] != valueAt(i) : !std::isnan(a[i]))
                QFAIL(qPrintable(QString("value %1 differs").arg(i)));
    }
    // The file is unlinked from the start.
    QCOMPARE(QDir(dir.path()).entryList(QDir::NoDotAndDotDot | QDir::AllEntries).size(), 0);
}

void TestSpillableArray::releaseGivesPagesBackAndKeepsValues()
{
    QTemporaryDir dir;
    SpillableArray a;
    const std::size_t n = std::size_t(64) << 18;  // 64 MiB of floats
    a.assign(n, 0.0f, dir.path().toStdString());
    const std::int64_t before = residentFileKib();
    for (std::size_t i = 0; i < n; ++i)
        a[i] = valueAt(i);
    const std::int64_t written = residentFileKib();
    QVERIFY2(written - before > 60'000, qPrintable(QString("resident %1 -> %2 KiB").arg(before).arg(written)));
    // Half of it released: about half goes.
    a.release(0, n / 2);
    const std::int64_t half = residentFileKib();
    QVERIFY2(written - half > 30'000 && written - half < 34'000, qPrintable(QString("%1 -> %2 KiB").arg(written).arg(half)));
    a.release(n / 2, n - n / 2);
    QVERIFY(residentFileKib() - before < 1'000);
    for (std::size_t i = 0; i < n; ++i)
        if (a[i] != valueAt(i))
            QFAIL(qPrintable(QString("value %1 lost").arg(i)));
    // A range that does not cover a whole page releases nothing around it.
    a.release(1, 3);
    QCOMPARE(a[0], valueAt(0));
    QCOMPARE(a[4], valueAt(4));
}

void TestSpillableArray::copiesAndMovesKeepTheirKind()
{
    QTemporaryDir dir;
    SpillableArray a;
    a.assign(300'000, 1.5f, dir.path().toStdString());
    a[299'999] = -2.0f;
    SpillableArray copy = a;
    QVERIFY(copy.spilled());
    QVERIFY(copy.data() != a.data());
    copy[0] = 3.0f;
    QCOMPARE(a[0], 1.5f);
    QCOMPARE(copy[299'999], -2.0f);
    SpillableArray moved = std::move(copy);
    QVERIFY(copy.empty() && moved.spilled());
    QCOMPARE(moved[0], 3.0f);
    SpillableArray inMemory;
    inMemory.assign(10, 4.0f);
    moved = inMemory;
    QVERIFY(!moved.spilled());
    QCOMPARE(moved.size(), std::size_t(10));
    QCOMPARE(moved[9], 4.0f);
    moved = std::move(a);
    QVERIFY(moved.spilled());
    QCOMPARE(moved[299'999], -2.0f);
}

void TestSpillableArray::anUnusableDirectoryIsNamed()
{
    SpillableArray a;
    try {
        a.assign(1000, 0.0f, "/nonexistent/kvscope-spill");
        QFAIL("no error");
    } catch (const std::runtime_error& e) {
        const std::string what = e.what();
        QVERIFY2(what.find("/nonexistent/kvscope-spill") != std::string::npos && what.find("TMPDIR") != std::string::npos,
                 e.what());
    }
    QVERIFY(a.empty());
}

QTEST_GUILESS_MAIN(TestSpillableArray)
#include "tst_spillable_array.moc"
