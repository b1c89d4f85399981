// The median as the floors and the what-if take it (util/median.h): the upper middle element
// of a sorted copy, NaN for none; other quantiles by the same rank rule; checked against
// sorting in the test.

#include "util/median.h"

#include <QTest>

#include <algorithm>
#include <cmath>
#include <random>

using namespace kvscope;

class TestMedian : public QObject {
    Q_OBJECT

private slots:
    void handWorked();
    void againstSorting();
};


void TestMedian::handWorked()
{
    QVERIFY(std::isnan(median({})));
    QCOMPARE(median({5.0}), 5.0);
    QCOMPARE(median({3.0, 1.0}), 3.0);  // the upper middle, not the mean
    QCOMPARE(median({9.0, 1.0, 4.0}), 4.0);
    QCOMPARE(median({4.0, 1.0, 3.0, 2.0}), 3.0);
    std::vector<double> values{2.0, 2.0, 2.0, 1.0};
    QCOMPARE(medianInPlace(values), 2.0);
}

void TestMedian::againstSorting()
{
    std::mt19937 rng(11);
    std::normal_distribution<double> value(0.0, 3.0);
    for (std::size_t n = 1; n < 200; n += 7) {
        std::vector<double> values(n);
        for (double& v : values)
            v = value(rng);
        std::vector<double> sorted = values;
        std::sort(sorted.begin(), sorted.end());
        QCOMPARE(median(values), sorted[n / 2]);
        for (double q : {0.0, 0.1, 0.9, 0.99}) {
            std::vector<double> copy = values;
            QCOMPARE(upperQuantileInPlace(copy, q), sorted[std::min(n - 1, std::size_t(q * double(n)))]);
        }
    }
}

QTEST_GUILESS_MAIN(TestMedian)
#include "tst_median.moc"
