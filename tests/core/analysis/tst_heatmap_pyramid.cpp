// The map at every zoom: each window of the pyramid, checked column by column against the
// worst value of the same tokens read straight from the full grid.

#include "analysis/heatmap_pyramid.h"

#include <QTest>

#include <cmath>
#include <cstdint>
#include <random>

using namespace kvscope;

namespace {

// rows x columns of values in [0, 1) with a head each, a few NaN cells and a NaN run.
HeatmapGrid randomGrid(int rows, std::int64_t columns, std::uint64_t seed)
{
    std::mt19937_64 rng(seed);
    std::uniform_real_distribution<float> value(0.0f, 1.0f);
    HeatmapGrid g;
    g.rows = rows;
    g.columns = columns;
    for (int r = 0; r < rows; ++r)
        for (std::int64_t c = 0; c < columns; ++c) {
            const bool absent = rng() % 17 == 0 || (r == 1 && c >= columns / 3 && c < columns / 2);
            g.values.push_back(absent ? std::nanf("") : value(rng));
            g.heads.push_back(absent ? -1 : std::int16_t(rng() % 8));
        }
    return g;
}

}  // namespace

class TestHeatmapPyramid : public QObject {
    Q_OBJECT

private slots:
    void windowsHoldTheWorstOfTheirTokens_data();
    void windowsHoldTheWorstOfTheirTokens();
    void levelsHalve();
};

void TestHeatmapPyramid::windowsHoldTheWorstOfTheirTokens_data()
{
    QTest::addColumn<bool>("lowerWorse");
    QTest::newRow("max (errors, ratios)") << false;
    QTest::newRow("min (BC)") << true;
}

void TestHeatmapPyramid::windowsHoldTheWorstOfTheirTokens()
{
    QFETCH(bool, lowerWorse);
    const std::int64_t columns = 10007;  // prime: no level divides it
    const HeatmapGrid full = randomGrid(5, columns, 11);
    const HeatmapPyramid pyramid(full, lowerWorse);
    std::mt19937_64 rng(3);
    for (int trial = 0; trial < 400; ++trial) {
        std::int64_t from = std::int64_t(rng() % std::uint64_t(columns));
        std::int64_t to = from + 1 + std::int64_t(rng() % std::uint64_t(columns - from));
        const std::int64_t maxColumns = 1 + std::int64_t(rng() % 1500);
        const HeatmapGrid w = pyramid.window(from, to, maxColumns);
        const QString where = QString("tokens %1-%2 in %3 columns").arg(from).arg(to).arg(maxColumns);
        QVERIFY2(w.rows == full.rows, qPrintable(where));
        QVERIFY2(w.columns <= maxColumns + 1, qPrintable(where + QString(": %1 columns").arg(w.columns)));
        // The columns cover [from, to), in runs that start at a multiple of their width.
        QVERIFY2(w.firstToken <= from && w.firstToken + w.columns * w.tokensPerColumn >= to, qPrintable(where));
        QVERIFY2(w.firstToken % w.tokensPerColumn == 0, qPrintable(where));
        QVERIFY2(w.tokensPerColumn >= (to - from + maxColumns - 1) / maxColumns, qPrintable(where));
        for (int r = 0; r < w.rows; ++r)
            for (std::int64_t c = 0; c < w.columns; ++c) {
                float worst = std::nanf("");
                bool headHolds = false;
                const std::int64_t begin = w.firstToken + c * w.tokensPerColumn;
                for (std::int64_t t = begin; t < std::min(columns, begin + w.tokensPerColumn); ++t) {
                    const float v = full.at(r, t);
                    if (!std::isnan(v) && (std::isnan(worst) || (lowerWorse ? v < worst : v > worst)))
                        worst = v;
                }
                for (std::int64_t t = begin; t < std::min(columns, begin + w.tokensPerColumn); ++t)
                    headHolds = headHolds || (full.at(r, t) == worst && full.headAt(r, t) == w.headAt(r, c));
                const float shown = w.at(r, c);
                QVERIFY2((std::isnan(worst) && std::isnan(shown) && w.headAt(r, c) == -1) || (shown == worst && headHolds),
                         qPrintable(where + QString(", row %1, column %2: %3, the tokens' worst %4").arg(r).arg(c).arg(shown).arg(worst)));
            }
    }
}

void TestHeatmapPyramid::levelsHalve()
{
    const HeatmapPyramid pyramid(randomGrid(3, 1000, 5), false);
    QCOMPARE(pyramid.levels(), 11);  // 1000, 500, 250, 125, 63, 32, 16, 8, 4, 2, 1 columns
    for (int k = 1; k < pyramid.levels(); ++k) {
        QCOMPARE(pyramid.level(k).columns, (pyramid.level(k - 1).columns + 1) / 2);
        QCOMPARE(pyramid.level(k).tokensPerColumn, std::int64_t(1) << k);
    }
    // Zoomed in: the tokens themselves.
    const HeatmapGrid w = pyramid.window(100, 140, 400);
    QCOMPARE(w.tokensPerColumn, std::int64_t(1));
    QCOMPARE(w.firstToken, std::int64_t(100));
    QCOMPARE(w.columns, std::int64_t(40));
}

QTEST_GUILESS_MAIN(TestHeatmapPyramid)
#include "tst_heatmap_pyramid.moc"
