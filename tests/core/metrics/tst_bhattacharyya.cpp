// The Bhattacharyya coefficient: hand-worked cases and numpy-exact binning on the edges.

#include "metrics/bhattacharyya.h"
#include "metrics/bc_vs_noise.h"
#include "metric_reference.h"
#include "test_support.h"

#include <QTest>

#include <map>
#include <random>

using namespace kvscope;
using namespace kvtest;

class TestBhattacharyya : public QObject {
    Q_OBJECT

private slots:
    void bcHandWorked();
    void bcBinsFollowNumpy();
    void bcVsNoiseHandWorked();
    void bcVsNoiseMatchesTheDefinition();
};

void TestBhattacharyya::bcHandWorked()
{
    // The 1e-10 in p = counts / (sum + 1e-10) keeps identical sets a hair below 1.
    QVERIFY(std::abs(bhattacharyyaOfSets({0.1, 0.2, 0.3}, {0.1, 0.2, 0.3}) - 1.0) < 1e-9);  // identical
    QCOMPARE(bhattacharyyaOfSets({0, 0, 0}, {1, 1, 1}), 0.0);                               // disjoint ends
    QCOMPARE(bhattacharyyaOfSets({}, {1.0}), 0.0);                                          // empty set
    QVERIFY(std::abs(bhattacharyyaOfSets({2, 2}, {2, 2, 2}) - 1.0) < 1e-9);                 // zero-width range
    // a = {0, 0.5, 1}, b = {0, 1, 1} on [0, 1]: bins 0, 50, 99 and 0, 99, 99.
    // BC = sqrt(1/3 * 1/3) + sqrt(1/3 * 0) + sqrt(1/3 * 2/3) = 1/3 + sqrt(2)/3.
    QVERIFY(std::abs(bhattacharyyaOfSets({0, 0.5, 1}, {0, 1, 1}) - (1.0 + std::sqrt(2.0)) / 3.0) < 1e-9);
    // Four values in one bin vs spread over two: p = (1), q = (1/2, 1/2) -> sqrt(1/2).
    QVERIFY(std::abs(bhattacharyyaOfSets({0.0, 0.001, 0.002, 0.003}, {0.0, 0.0, 1.0, 1.0}) - std::sqrt(0.5)) < 1e-9);
}

void TestBhattacharyya::bcBinsFollowNumpy()
{
    std::mt19937 rng(5);
    std::uniform_real_distribution<double> u(0, 1);
    for (int trial = 0; trial < 200; ++trial) {
        ErrorRange r;
        r.add(u(rng) * 0.01);
        r.add(0.01 + u(rng) * 3);
        const SharedBins bins(r);
        std::vector<double> values{r.lo, r.hi};
        for (int i = 0; i <= 100; ++i) {
            values.push_back(bins.edge(i));  // exactly on every edge, and one ulp either side
            values.push_back(std::nextafter(bins.edge(i), -1.0));
            values.push_back(std::nextafter(bins.edge(i), 10.0));
        }
        for (int i = 0; i < 20; ++i)
            values.push_back(r.lo + u(rng) * (r.hi - r.lo));
        for (double v : values) {
            if (v < r.lo || v > r.hi)
                continue;
            int expect = 99;
            while (expect > 0 && double(expect) * ((r.hi - r.lo) / 100) + r.lo > v)
                --expect;
            QCOMPARE(bins.binOf(v), expect);
        }
        QCOMPARE(bins.binOf(r.hi + 1e-9), -1);
        QCOMPARE(bins.binOf(std::nan("")), -1);
    }
}

void TestBhattacharyya::bcVsNoiseHandWorked()
{
    // Bins by hand: 1.0 = 2^0 (exponent field 127) -> 127 * 8 = 1016; 1.5 adds mantissa .1 -> 1020;
    // 0.75 = 1.5 * 2^-1 -> 1012; 0 -> 0; 1.0625 stays in 1.0's bin (eight per octave).
    QCOMPARE(logBinOf(1.0f), 1016);
    QCOMPARE(logBinOf(1.5f), 1020);
    QCOMPARE(logBinOf(0.75f), 1012);
    QCOMPARE(logBinOf(1.0625f), 1016);
    QCOMPARE(logBinOf(0.0f), 0);
    QCOMPARE(logBinOf(std::nanf("")), -1);
    for (float e : {1e-30f, 1e-40f, 3.7e-3f, 0.3f, 17.0f, 1e30f})
        QCOMPARE(logBinOf(e), referenceLogBin(e));
    // The same errors: 1. Half of the actual errors far beyond the noise: only 0.001's bin is
    // shared, sqrt(0.5 * 0.5) = 0.5.
    const std::vector<float> noise{0.001f, 0.002f}, same{0.002f, 0.001f}, half{0.001f, 5.0f};
    LogHistogram a, b, c, empty;
    a.add(noise.data(), 2);
    b.add(same.data(), 2);
    c.add(half.data(), 2);
    QCOMPARE(bcVsNoise(a, b), 1.0);
    QVERIFY(std::abs(bcVsNoise(a, c) - std::sqrt(0.5 * 0.5)) < 1e-12);
    QVERIFY(std::isnan(bcVsNoise(a, empty)));
    // Merging is adding counts; clearing empties.
    LogHistogram pooled;
    pooled.merge(b);
    pooled.merge(c);
    QCOMPARE(pooled.counts[std::size_t(logBinOf(0.001f))], 2u);
    QCOMPARE(pooled.counts[std::size_t(logBinOf(5.0f))], 1u);
    pooled.clear();
    QVERIFY(std::isnan(bcVsNoise(a, pooled)));
}

void TestBhattacharyya::bcVsNoiseMatchesTheDefinition()
{
    // Errors over many octaves (a few hundred bins, a bin count that is no multiple of four,
    // empty bins on either side, one set wider than the other), against sum sqrt(p q) with
    // p = base counts / base total, q = actual counts / actual total, in long double.
    std::mt19937 random(57);
    for (int trial = 0; trial < 50; ++trial) {
        std::lognormal_distribution<float> noise(-9.0f, 1.5f + 0.05f * float(trial)), fault(-7.0f, 3.0f);
        std::vector<float> base(1000 + std::size_t(trial) * 37), actual(900 + std::size_t(trial) * 53);
        for (float& e : base)
            e = noise(random);
        for (float& e : actual)
            e = trial % 3 ? noise(random) : fault(random);
        if (trial % 5 == 0)
            actual[0] = 0.0f;  // the zero bin, on one side only
        LogHistogram b, a;
        b.add(base.data(), base.size());
        a.add(actual.data(), actual.size());
        std::map<int, std::pair<long double, long double>> counts;
        for (float e : base)
            counts[logBinOf(e)].first += 1;
        for (float e : actual)
            counts[logBinOf(e)].second += 1;
        long double expect = 0;
        for (const auto& [bin, c] : counts)
            expect += std::sqrt(c.first / (long double)(base.size()) * c.second / (long double)(actual.size()));
        QVERIFY2(std::abs(bcVsNoise(b, a) - double(expect)) < 1e-13,
                 qPrintable(QString("trial %1: %2 against %3").arg(trial).arg(bcVsNoise(b, a), 0, 'g', 17).arg(double(expect), 0, 'g', 17)));
        QVERIFY(std::abs(bcVsNoise(b, b) - 1.0) < 1e-13);
    }
}

QTEST_APPLESS_MAIN(TestBhattacharyya)
#include "tst_bhattacharyya.moc"
