// A prompt map's labelling: where the suspect starts (its onset row, framed) and the layers its
// error spreads to (dimmed and labelled), so that the eye finds the onset rather than the
// largest error; worked by hand from a suspect placed in the test.

#include "analysis/map_spec.h"
#include "analysis/off_floor.h"
#include "format/kv_cache_config.h"

#include <QTest>

#include <cmath>

using namespace kvscope;

namespace {

KvCacheConfig fourLayers()
{
    return KvCacheConfig::fromJson(R"({"num_blocks": 16, "tp_size": 1, "total_num_kv_heads": 2, "groups": [
        {"layer_names": ["model.layers.0.self_attn", "model.layers.1.self_attn", "model.layers.2.self_attn",
                         "model.layers.3.self_attn"],
         "spec_type": "FullAttentionSpec", "block_size": 4, "dtype": "torch.bfloat16", "num_kv_heads": 2, "head_size": 8}]})");
}

PromptAnalysis fourLayerPrompt()
{
    PromptAnalysis p;
    p.id = "p0";
    p.promptLen = 3;
    p.tokens = 4;
    p.heads = 2;
    for (int l = 0; l < 4; ++l)
        p.layers.push_back("model.layers." + std::to_string(l) + ".self_attn");
    return p;
}

}  // namespace

class TestMapSpec : public QObject {
    Q_OBJECT

private slots:
    void layerNamesShortenedAsEveryViewSaysThem()
    {
        QCOMPARE(QString::fromStdString(shortLayerName("model.layers.3.self_attn")), QString("model.layers.3"));
        QCOMPARE(QString::fromStdString(shortLayerName("model.layers.3.self_attn.attn")), QString("model.layers.3"));  // vLLM's
        QCOMPARE(QString::fromStdString(shortLayerName("model.layers.7.mixer")), QString("model.layers.7.mixer"));
        QCOMPARE(QString::fromStdString(shortLayerName(".attn")), QString(".attn"));  // nothing would be left
    }

    void theSuspectsOnsetIsFramedAndItsSpreadDimmed()
    {
        PromptAnalysis p = fourLayerPrompt();
        Suspect s;
        s.firstLayer = "model.layers.1.self_attn";
        s.layers = {"model.layers.1.self_attn", "model.layers.2.self_attn", "model.layers.3.self_attn"};
        p.suspects = {s};
        const MapSpec m = promptMapSpec(fourLayers(), p, PromptInfo{}, HeatmapSpec{});
        QCOMPARE(m.onsetRow, 1);
        QCOMPARE(m.spreadRows, (std::vector<int>{2, 3}));
        QCOMPARE(m.spreadLabel, std::string("spread from model.layers.1"));
    }

    void noSuspectNoMarks()
    {
        const MapSpec m = promptMapSpec(fourLayers(), fourLayerPrompt(), PromptInfo{}, HeatmapSpec{});
        QCOMPARE(m.onsetRow, -1);
        QVERIFY(m.spreadRows.empty());
        QVERIFY(m.spreadLabel.empty());
    }

    void anOnsetAloneHasNoSpread()
    {
        PromptAnalysis p = fourLayerPrompt();
        Suspect s;
        s.firstLayer = "model.layers.3.self_attn";
        s.layers = {"model.layers.3.self_attn"};
        p.suspects = {s};
        const MapSpec m = promptMapSpec(fourLayers(), p, PromptInfo{}, HeatmapSpec{});
        QCOMPARE(m.onsetRow, 3);
        QVERIFY(m.spreadRows.empty());
        QVERIFY(m.spreadLabel.empty());
    }

    void aSuspectsLayersAreOffWhereTheSuspectsSay()
    {
        // The map's off level is the suspects' rule for a hundred times the cells (noise reaches
        // it once in a hundred captures): three-way, 2 x perDecade floors higher. In a layer a
        // suspect affects, the suspects' own level: the cells they call off are drawn off.
        PromptAnalysis p = fourLayerPrompt();
        p.threeWay = true;
        p.tokens = 2000;  // (enough cells that neither level is held at its floor)
        p.allocate();
        for (auto& metric : p.metrics)
            for (std::size_t i = 0; i < metric.size(); ++i)
                metric[i] = 0.01f;
        const SuspectThresholds th;
        std::vector<double> thresholds = mapOffThresholds(p, th, nullptr);
        const std::vector<double> map = thresholds;
        useSuspectThresholds(p, th, nullptr, thresholds);
        QCOMPARE(thresholds, map);  // no suspect: the map's
        Suspect s;
        s.firstLayer = "model.layers.1.self_attn";
        s.layers = {"model.layers.1.self_attn", "model.layers.2.self_attn"};
        p.suspects = {s};
        useSuspectThresholds(p, th, nullptr, thresholds);
        for (int l : {0, 3})
            QCOMPARE(thresholds[std::size_t(l)], map[std::size_t(l)]);
        for (int l : {1, 2})
            QVERIFY2(std::abs(map[std::size_t(l)] - thresholds[std::size_t(l)] - 2 * th.perDecade) < 1e-9,
                     qPrintable(QString("%1 vs %2").arg(map[std::size_t(l)]).arg(thresholds[std::size_t(l)])));
    }

    void aCleanTokensBcIsQuiet()
    {
        // The BC scale's colour at a clean layer's per-token BC (0.94-0.99 with 1,000 values a
        // token or more) is the quiet colour the map in floors gives noise; below 0.8 it is red.
        const std::vector<ColorStop>& bc = colorStops(ScaleKind::Bc);
        const std::vector<ColorStop>& ratio = colorStops(ScaleKind::Ratio);
        const auto colourAt = [&](double at) {
            for (std::size_t i = 1; i < bc.size(); ++i)
                if (at <= bc[i].at) {
                    const double f = (at - bc[i - 1].at) / (bc[i].at - bc[i - 1].at);
                    const auto mix = [&](int a, int b) { return int(std::lround(a + f * (b - a))); };
                    return Rgb{mix(bc[i - 1].color.r, bc[i].color.r), mix(bc[i - 1].color.g, bc[i].color.g),
                               mix(bc[i - 1].color.b, bc[i].color.b)};
                }
            return bc.back().color;
        };
        for (double clean : {0.94, 0.97, 0.99, 1.0}) {
            const Rgb c = colourAt(clean);
            QCOMPARE(c.r, ratio.front().color.r);
            QCOMPARE(c.g, ratio.front().color.g);
            QCOMPARE(c.b, ratio.front().color.b);
        }
        const Rgb red = colourAt(0.79);
        QVERIFY(red.r > 200 && red.g < 60 && red.b < 60);
    }
};

QTEST_GUILESS_MAIN(TestMapSpec)
#include "tst_map_spec.moc"
