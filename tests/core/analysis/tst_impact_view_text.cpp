// What the views say of impact: a suspect's short form, a layer against its noise, the ratio as
// the suspect's sentence rounds it; figures written in the test, texts worked by hand.

#include "analysis/impact_view_text.h"

#include <QTest>

using namespace kvscope;

namespace {

ImpactFigures figures(double median, double max, int changed, int steps)
{
    ImpactFigures f;
    f.klMedian = median;
    f.klMax = max;
    f.top1Changed = changed;
    f.steps = steps;
    return f;
}

QString q(const std::string& s)
{
    return QString::fromStdString(s);
}

}  // namespace

class TestImpactViewText : public QObject {
    Q_OBJECT

private slots:
    void aSuspectsRowSaysStepsKlAndNoise()
    {
        SuspectImpact impact;
        impact.engine = figures(0.00065, 0.0029, 4, 40);
        impact.noise = figures(0.0001, 0.00057, 4, 40);
        // 0.0029 / 0.00057 = 5.0877...: 5.1 to two digits
        QCOMPARE(q(impactShortText(impact)), QString::fromUtf8("output: 4/40 steps changed, KL \u2264 0.0029 (5.1x noise)"));
        impact.noise.reset();  // two-way: no noise to say
        QCOMPARE(q(impactShortText(impact)), QString::fromUtf8("output: 4/40 steps changed, KL \u2264 0.0029"));
        impact.noise = figures(0, 0, 0, 40);  // a noise of 0 has no ratio
        QCOMPARE(q(impactShortText(impact)), QString::fromUtf8("output: 4/40 steps changed, KL \u2264 0.0029"));
    }

    void theRatioIsTheLargestKlOverTheNoisesLargest()
    {
        QCOMPARE(noiseRatio(figures(0, 0.3, 0, 1), figures(0, 0.02, 0, 1)).value(), 15.0);
        QCOMPARE(q(noiseRatioText(figures(0, 0.3, 0, 1), figures(0, 0.02, 0, 1))), QString("15x"));
        QCOMPARE(q(noiseRatioText(figures(0, 0.0123, 0, 1), figures(0, 0.01, 0, 1))), QString("1.2x"));
        QCOMPARE(q(noiseRatioText(figures(0, 0.3, 0, 1), std::nullopt)), QString("-"));
        QCOMPARE(q(noiseRatioText(std::nullopt, figures(0, 0.3, 0, 1))), QString("-"));
    }

    void aLayerIsAboveNoiseBeyondFourTimesIt()
    {
        LayerImpact l;
        QCOMPARE(impactLevel(l), ImpactLevel::None);
        l.alone = figures(0.001, 0.004, 0, 10);
        QCOMPARE(impactLevel(l), ImpactLevel::NoNoise);
        l.aloneNoise = figures(0.0005, 0.001, 0, 10);
        QCOMPARE(impactLevel(l), ImpactLevel::WithinNoise);  // 4x exactly: within what a clean engine does
        l.alone->klMax = 0.0041;
        QCOMPARE(impactLevel(l), ImpactLevel::AboveNoise);
        l.aloneNoise->klMax = 0;  // a noise of 0: any KL is beyond it
        QCOMPARE(impactLevel(l), ImpactLevel::AboveNoise);
        l.alone->klMax = 0;
        QCOMPARE(impactLevel(l), ImpactLevel::WithinNoise);
    }

    void aLayersLinesSayEachRowItHas()
    {
        LayerImpact l;
        l.layer = "model.layers.2.self_attn";
        QVERIFY(layerImpactLines(l).empty());
        l.alone = figures(0.0015, 0.003, 1, 4);
        l.aloneNoise = figures(0.0001, 0.0002, 0, 4);
        l.from = figures(0.02, 0.25, 3, 4);
        const std::vector<std::string> lines = layerImpactLines(l);
        QCOMPARE(int(lines.size()), 4);
        QCOMPARE(q(lines[0]), QString("the engine's KV in this layer alone: KL up to 0.003 nats (median 0.0015), top-1 changed at 1 of 4 steps"));
        QCOMPARE(q(lines[1]), QString("the baseline's KV in it (bf16 noise): KL up to 0.0002 nats (median 0.0001), top-1 changed at 0 of 4 steps"));
        QCOMPARE(q(lines[2]), QString("alone: 15x the noise"));  // 0.003 / 0.0002
        QCOMPARE(q(lines[3]), QString("the engine's KV from this layer on: KL up to 0.25 nats (median 0.02), top-1 changed at 3 of 4 steps"));
    }
};

QTEST_GUILESS_MAIN(TestImpactViewText)
#include "tst_impact_view_text.moc"
