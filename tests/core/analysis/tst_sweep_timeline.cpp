// A soak run over time, worked by hand: captures whose worst cell rises from half a floor to 80
// floors, placed at their recorded times; the rank correlation and the times checked against
// values computed by hand.

#include "analysis/sweep_timeline.h"
#include "quiet_prompt.h"

#include <QTest>

#include <cmath>

using namespace kvscope;
using namespace kvtest;

namespace {

// A three-way prompt of 2 layers x 8 positions x 2 heads, a tenth of a floor everywhere (base
// L-inf 1e-2, actual 1e-3) but one K cell at `worst` floors.
PromptAnalysis prompt(const std::string& id, float worst)
{
    PromptAnalysis p = quietPrompt(8, 6, 2, true, id);
    setMetric(p, KvPart::K, MetricKind::Linf, 1, 7, 0, worst * 1e-2f);
    return p;
}

AnalysisResult sweep(const std::vector<float>& worst, bool withTimes)
{
    AnalysisResult r;
    for (std::size_t i = 0; i < worst.size(); ++i) {
        const std::string name = "soak_" + std::to_string(i);
        SweepBundle b{name, "/tmp/" + name + ".h5", {}};
        if (withTimes)  // a minute apart, the third one 30.5 s late
            b.created = "2026-12-01T10:0" + std::to_string(i) + ":" + (i == 2 ? "30.5" : "00") + "Z";
        r.bundles.push_back(b);
        r.prompts.push_back(prompt(name + "/prompt_0", worst[i]));
    }
    return r;
}

}  // namespace

class TestSweepTimeline : public QObject {
    Q_OBJECT

private slots:
    void isoTimes()
    {
        QCOMPARE(*isoSeconds("1970-01-01T00:00:00Z"), 0.0);
        QCOMPARE(*isoSeconds("2000-01-01T00:00:00Z"), 946684800.0);  // 30 years, 7 of them leap: 10957 days
        QCOMPARE(*isoSeconds("2026-11-30T17:35:46.5+00:00") - *isoSeconds("2026-11-30T17:35:00Z"), 46.5);
        QVERIFY(!isoSeconds("2026-11-30 17:35:46Z"));
        QVERIFY(!isoSeconds("2026-11-30T17:35:46+02:00"));  // not UTC: the writers record UTC
        QVERIFY(!isoSeconds(""));
    }

    void rankCorrelation()
    {
        QCOMPARE(spearman({1, 2, 3, 4, 5}, {2, 4, 6, 8, 10}), 1.0);
        QCOMPARE(spearman({1, 2, 3, 4, 5}, {10, 8, 6, 4, 2}), -1.0);
        // Rank differences 0, 1, -1, 1, -1: 1 - 6 * 4 / (5 * 24) = 0.8.
        QVERIFY(std::abs(spearman({1, 2, 3, 4, 5}, {1, 3, 2, 5, 4}) - 0.8) < 1e-12);
        // Tied ranks 0.5, 0.5, 2 against 0, 1, 2: 1.5 / sqrt(2 * 1.5).
        QVERIFY(std::abs(spearman({1, 2, 3}, {1, 1, 2}) - 1.5 / std::sqrt(3.0)) < 1e-12);
        QVERIFY(std::isnan(spearman({1, 2}, {1, 2})));
        QVERIFY(std::isnan(spearman({1, 2, 3}, {4, 4, 4})));
    }

    void aRisingSoakRunIsATrend()
    {
        const std::optional<SweepTimeline> t = sweepTimeline(sweep({0.5f, 1, 2, 4, 50, 80}, true), {});
        QVERIFY(t);
        QVERIFY(t->perBundle);
        QVERIFY(t->byTime);
        QCOMPARE(t->points.size(), std::size_t(6));
        QCOMPARE(t->points[0].x, 0.0);
        QCOMPARE(t->points[2].x, 150.5);
        QCOMPARE(t->points[5].x, 300.0);
        QVERIFY(std::abs(double(t->points[4].worstRatio) - 50) < 1e-3);
        QCOMPARE(t->points[0].prompts, 1);
        // 50 and 80 floors are off (the map's threshold is about 6 + 2.6 log10(100 x 64 / 1000) = 8.1); 4 is not.
        QCOMPARE(t->points[3].offFraction, 0.0);
        QCOMPARE(t->points[4].offFraction, 1.0 / 32);  // one of 2 layers x 8 positions x K/V
        // Per layer, over its off threshold: 50 / (6 + 2.6 log10(6.4)) in layer 1, a tenth of a floor in layer 0.
        QCOMPARE(t->layers.size(), std::size_t(2));
        QVERIFY(std::abs(double(t->points[4].layerOff[1]) - 50 / (6 + 2.6 * std::log10(6.4))) < 0.01);
        QVERIFY(t->points[4].layerOff[0] < 0.1f / 6);
        QCOMPARE(t->rankCorrelation, 1.0);
        const QString trend = QString::fromStdString(t->trend);
        QVERIFY2(trend.contains("capture time") && trend.contains("Spearman 1 over 6 captures") &&
                     trend.contains("from 0.5 floors at soak_0 to 80 at soak_5") && trend.contains("off cells in 2 of them, the first soak_4"),
                 qPrintable(trend));
    }

    void withoutTimesInBundleOrder()
    {
        const std::optional<SweepTimeline> t = sweepTimeline(sweep({0.5f, 1, 2, 4, 50}, false), {});
        QVERIFY(t);
        QVERIFY(!t->byTime);
        QCOMPARE(t->points[3].x, 3.0);
        QVERIFY(QString::fromStdString(t->trend).contains("capture order"));
    }

    void noiseIsNoTrend()
    {
        // Rising, but never off the floor.
        std::optional<SweepTimeline> t = sweepTimeline(sweep({0.5f, 1, 2, 3, 4, 5}, true), {});
        QVERIFY(t);
        QCOMPARE(t->rankCorrelation, 1.0);
        QVERIFY(t->trend.empty());
        // One bad capture among quiet ones is not a rise.
        t = sweepTimeline(sweep({0.5f, 90, 0.4f, 0.6f, 0.3f, 0.5f}, true), {});
        QVERIFY(t->trend.empty());
    }

    void oneBundleTakesItsRequests()
    {
        AnalysisResult few;
        for (int i = 0; i < 3; ++i)
            few.prompts.push_back(prompt("prompt_" + std::to_string(i), 1));
        QVERIFY(!sweepTimeline(few, {}));  // three prompts are no soak run
        AnalysisResult many;
        for (int i = 0; i < 6; ++i)
            many.prompts.push_back(prompt("prompt_" + std::to_string(i), float(1 << i) * 3));
        const std::optional<SweepTimeline> t = sweepTimeline(many, {});
        QVERIFY(t);
        QVERIFY(!t->perBundle);
        QCOMPARE(t->points[4].name, std::string("prompt_4"));
        QVERIFY(QString::fromStdString(t->trend).contains("request index"));
    }
};

QTEST_GUILESS_MAIN(TestSweepTimeline)
#include "tst_sweep_timeline.moc"
