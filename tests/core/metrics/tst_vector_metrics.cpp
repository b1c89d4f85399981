// Relative L-inf, relative L2 and cosine of two vectors against a double-precision reference.

#include "metrics/vector_metrics.h"
#include "util/simd_clones.h"
#include "metric_reference.h"
#include "test_support.h"

#include <QTest>

#include <cmath>
#include <random>
#include <tuple>

using namespace kvscope;
using namespace kvtest;

class TestVectorMetrics : public QObject {
    Q_OBJECT

private slots:
    void vectorMetrics();
    void pairMatchesTwoComparisons();
    void vectorPathsAddInTheLaneOrder();
};

void TestVectorMetrics::vectorMetrics()
{
    std::mt19937 rng(3);
    std::normal_distribution<float> n01;
    for (int dim : {1, 3, 128}) {
        for (int trial = 0; trial < 50; ++trial) {
            std::vector<float> a(static_cast<std::size_t>(dim)), b(static_cast<std::size_t>(dim));
            for (int i = 0; i < dim; ++i)
                a[std::size_t(i)] = n01(rng) * 5, b[std::size_t(i)] = a[std::size_t(i)] + n01(rng) * 0.1f;
            if (trial == 1)
                std::fill(a.begin(), a.end(), 0.0f);  // zero reference
            if (trial == 2)
                std::fill(b.begin(), b.end(), 0.0f);  // zero target
            if (trial == 3)
                b = a;  // identical
            VectorComparison c;
            QVERIFY(compareVectors(a.data(), b.data(), dim, c));
            const Ref r = referenceMetrics(a.data(), b.data(), dim);
            QVERIFY2(close(c.cos, r.cos, 1e-12) && close(c.linf, r.linf, 1e-12) && close(c.l2, r.l2, 1e-12),
                     qPrintable(QString("dim %1 trial %2").arg(dim).arg(trial)));
        }
    }
    // Hand-worked: ref (3, 4), x (3, 0): cos = 9 / (5 * 3) = 0.6, L-inf = 4 / 4, L2 = 4 / 5.
    const float ref[2] = {3, 4}, x[2] = {3, 0};
    VectorComparison c;
    QVERIFY(compareVectors(ref, x, 2, c));
    QCOMPARE(c.cos, 0.6);
    QCOMPARE(c.linf, 1.0);
    QCOMPARE(c.l2, 0.8);
    const float nan[2] = {1, std::nanf("")};
    QVERIFY(!compareVectors(ref, nan, 2, c));
}

// compareVectorPair against the double-precision reference, and bit for bit against two
// compareVectors calls (the same sums in the same order), on every path (KVSCOPE_SIMD), at
// lengths around the vector widths.
void TestVectorMetrics::pairMatchesTwoComparisons()
{
    std::mt19937 rng(11);
    std::normal_distribution<float> n01;
    for (int dim : {1, 3, 7, 8, 9, 15, 16, 17, 64, 128, 131}) {
        for (int trial = 0; trial < 40; ++trial) {
            const std::size_t size = std::size_t(dim);
            std::vector<float> ref(size), x(size), y(size);
            const float scale = std::pow(10.0f, float(trial % 7) - 3);
            for (std::size_t i = 0; i < ref.size(); ++i) {
                ref[i] = n01(rng) * scale;
                x[i] = ref[i] + n01(rng) * 1e-3f * scale;
                y[i] = ref[i] + n01(rng) * 1e-2f * scale;
            }
            if (trial == 1)
                x[std::size_t(dim) / 2] = std::nanf("");
            if (trial == 2)
                y[std::size_t(dim) - 1] = INFINITY;
            VectorComparison px, py, sx, sy;
            const int ok = compareVectorPair(ref.data(), x.data(), y.data(), dim, px, py);
            const bool okX = compareVectors(ref.data(), x.data(), dim, sx);
            const bool okY = compareVectors(ref.data(), y.data(), dim, sy);
            const QString where = QString("dim %1 trial %2").arg(dim).arg(trial);
            QCOMPARE(ok, (trial == 1 ? 0 : 1) | (trial == 2 ? 0 : 2));
            QCOMPARE(okX, trial != 1);
            QCOMPARE(okY, trial != 2);
            for (const auto& [pair, single, other] : {std::tuple{px, sx, &x}, std::tuple{py, sy, &y}}) {
                if (std::isnan((*other)[std::size_t(dim) / 2]) || std::isinf(other->back()))
                    continue;
                QVERIFY2(pair.cos == single.cos && pair.linf == single.linf && pair.l2 == single.l2, qPrintable(where));
                const Ref r = referenceMetrics(ref.data(), other->data(), dim);
                QVERIFY2(close(pair.cos, r.cos, 1e-12) && close(pair.linf, r.linf, 1e-12) && close(pair.l2, r.l2, 1e-12),
                         qPrintable(where));
            }
        }
    }
}

// The AVX2 and AVX-512 paths add as GCC's 8-lane AVX2 reduction did, so that either gives the
// same bits (docs/architecture.md): lane j sums the elements d = j mod 8 in order, the elements
// after the last multiple of 8 go to lane 0, and the lanes are summed 0..7 from 0. That order,
// written out here in double, must give their results bit for bit (run as is and under
// KVSCOPE_SIMD=avx2; the baseline adds as its compiler's vectoriser likes).
void TestVectorMetrics::vectorPathsAddInTheLaneOrder()
{
    if (simdLevel() == SimdLevel::Baseline)
        QSKIP("the baseline path's order is the compiler's");
    std::mt19937 rng(5);
    std::normal_distribution<float> n01;
    for (int dim : {1, 5, 8, 13, 64, 100, 128, 131}) {
        for (int trial = 0; trial < 20; ++trial) {
            const std::size_t size = std::size_t(dim);
            std::vector<float> ref(size), x(size), y(size);
            for (std::size_t i = 0; i < size; ++i) {
                ref[i] = n01(rng) * 3;
                x[i] = ref[i] + n01(rng) * 1e-3f;
                y[i] = ref[i] + n01(rng) * 1e-2f;
            }
            // In lane order: [lane][refSq, dot, xSq, diffSq] for x and for y.
            double lanes[2][8][4] = {};
            double maxRef = 0, maxDiff[2] = {0, 0};
            const int full = dim / 8 * 8;
            for (int side = 0; side < 2; ++side) {
                const std::vector<float>& v = side == 0 ? x : y;
                for (int d = 0; d < dim; ++d) {
                    double* l = lanes[side][d < full ? d % 8 : 0];
                    const double r = ref[std::size_t(d)], u = v[std::size_t(d)], diff = r - u;
                    l[0] += r * r;
                    l[1] += r * u;
                    l[2] += u * u;
                    l[3] += diff * diff;
                    maxRef = std::max(maxRef, std::fabs(r));
                    maxDiff[side] = std::max(maxDiff[side], std::fabs(diff));
                }
            }
            VectorComparison expected[2];
            for (int side = 0; side < 2; ++side) {
                double sum[4] = {0, 0, 0, 0};
                for (int k = 0; k < 4; ++k)
                    for (int j = 0; j < 8; ++j)
                        sum[k] += lanes[side][j][k];
                expected[side].cos = sum[1] / (std::max(std::sqrt(sum[0]), kCosineEps) * std::max(std::sqrt(sum[2]), kCosineEps));
                expected[side].linf = maxDiff[side] / std::max(maxRef, kRelativeEps);
                expected[side].l2 = std::sqrt(sum[3]) / std::max(std::sqrt(sum[0]), kRelativeEps);
            }
            VectorComparison px, py, sx;
            QCOMPARE(compareVectorPair(ref.data(), x.data(), y.data(), dim, px, py), 3);
            QVERIFY(compareVectors(ref.data(), x.data(), dim, sx));
            const QString where = QString("dim %1 trial %2").arg(dim).arg(trial);
            for (const auto& [got, want] : {std::pair{px, expected[0]}, std::pair{py, expected[1]}, std::pair{sx, expected[0]}})
                QVERIFY2(got.cos == want.cos && got.linf == want.linf && got.l2 == want.l2, qPrintable(where));
        }
    }
}

QTEST_APPLESS_MAIN(TestVectorMetrics)
#include "tst_vector_metrics.moc"
