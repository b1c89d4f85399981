// What-if by impact (quant/impact_recipe.h): hand-made records whose budgets and recipe are worked
// out here, vLLM's names for the schemes and layers, and a capture of a model with a head an fp8
// cache with one scale per tensor crushes (2^-16 of the others, made up exactly by its queries and
// output projection), whose recipe keeps exactly those layers in bf16, the layers the what-if's
// relative error calls hurt.

#include "format/bundle_reader.h"
#include "kv/capture_loader.h"
#include "quant/impact_recipe.h"
#include "quant/whatif.h"
#include "synth/model_capture.h"

#include "small_model.h"

#include <QTemporaryDir>
#include <QTest>

using namespace kvscope;

namespace {

const char* kLayers[] = {"model.layers.0.self_attn", "model.layers.1.self_attn", "model.layers.2.self_attn"};

// Two steps per row: KL {m, m} (median m) and no top-1 change.
ImpactRecord record(const std::vector<std::pair<Transplant, double>>& rows)
{
    ImpactRecord r;
    r.steps = 2;
    for (const auto& [t, kl] : rows) {
        r.transplants.push_back(t);
        r.kl.insert(r.kl.end(), {kl, kl});
        r.top1Changed.insert(r.top1Changed.end(), {0, 0});
    }
    return r;
}

QuantScheme scheme(const std::string& name)
{
    std::string error;
    return *parseScheme(name, error);
}

}  // namespace

class TestImpactRecipe : public QObject {
    Q_OBJECT
private slots:
    void vllmNames()
    {
        QCOMPARE(vllmLayerIndex("model.layers.23.self_attn"), std::optional<int>(23));
        QCOMPARE(vllmLayerIndex("layers.7.attn"), std::optional<int>(7));
        QVERIFY(!vllmLayerIndex("model.layers.3.experts.7").has_value());  // two integers: vLLM refuses
        QVERIFY(!vllmLayerIndex("attn").has_value());
        std::vector<std::string> extra;
        QCOMPARE(vllmKvCacheDtype(scheme("fp8_e4m3/tensor"), &extra), std::string("fp8_e4m3"));
        QVERIFY(extra.empty());
        QCOMPARE(vllmKvCacheDtype(scheme("fp8_e4m3/vllm"), &extra), std::string("fp8_e4m3"));
        QCOMPARE(extra, (std::vector<std::string>{"--calculate-kv-scales"}));
        QCOMPARE(vllmKvCacheDtype(scheme("fp8_e5m2/tensor")), std::string("fp8_e5m2"));
        QCOMPARE(vllmKvCacheDtype(scheme("int4/token_head_rht")), std::string("int4_per_token_head"));
        QCOMPARE(vllmKvCacheDtype(scheme("nvfp4")), std::string("nvfp4"));
        QVERIFY(vllmKvCacheDtype(scheme("fp8_e4m3/head")).empty());
        QVERIFY(vllmKvCacheDtype(scheme("int4/g32")).empty());
    }

    // Noise medians 6e-4, 3e-4, 1e-3; every scheme's typical ratio (the median over layers) 5/3, so
    // each layer's budget 10/3 of its noise: 2e-3, 1e-3, 3.33e-3. e4m3 (1e-3, 5e-4, 9e-3) keeps
    // layer 2: (8 + 8 + 16) / 3 bits; e5m2 (3e-3, 5e-4, 1e-3) keeps layer 0; int4 per token and
    // head (1e-3, 2e-3, 1e-3) keeps layer 1: (4 + 16 + 4) / 3 = 8 bits, the cheapest.
    void cheapestWithinTheNoiseBudget()
    {
        std::vector<std::pair<Transplant, double>> rows;
        const double noise[] = {6e-4, 3e-4, 1e-3}, e4m3[] = {1e-3, 5e-4, 9e-3}, e5m2[] = {3e-3, 5e-4, 1e-3},
                     int4[] = {1e-3, 2e-3, 1e-3};
        for (int l = 0; l < 3; ++l) {
            rows.push_back({{TransplantKind::Baseline, kLayers[l], {}}, noise[l]});
            rows.push_back({{TransplantKind::Scheme, kLayers[l], "fp8_e4m3/tensor"}, e4m3[l]});
            rows.push_back({{TransplantKind::Scheme, kLayers[l], "fp8_e5m2/tensor"}, e5m2[l]});
            rows.push_back({{TransplantKind::Scheme, kLayers[l], "int4/token_head_rht"}, int4[l]});
        }
        const ImpactRecord r = record(rows);
        const std::vector<std::string> layers(std::begin(kLayers), std::end(kLayers));
        const ImpactRecipe recipe = proposeRecipe({&r}, layers,
                                                  {scheme("fp8_e4m3/tensor"), scheme("fp8_e5m2/tensor"), scheme("int4/token_head_rht")});
        QCOMPARE(recipe.schemes.size(), std::size_t(3));
        QCOMPARE(recipe.schemes[0].keep, (std::vector<std::string>{kLayers[2]}));
        QCOMPARE(recipe.schemes[0].bitsPerValue, 32.0 / 3);
        QVERIFY(qFuzzyCompare(recipe.schemes[0].layers[0].budget, 2e-3));
        QVERIFY(qFuzzyCompare(recipe.schemes[0].layers[2].budget, 1e-2 / 3));
        QCOMPARE(recipe.schemes[1].keep, (std::vector<std::string>{kLayers[0]}));
        QCOMPARE(recipe.schemes[2].keep, (std::vector<std::string>{kLayers[1]}));
        QCOMPARE(recipe.schemes[2].bitsPerValue, 8.0);
        QCOMPARE(recipe.chosen, std::optional<std::size_t>(2));
        QCOMPARE(recipe.arguments, std::string("--kv-cache-dtype int4_per_token_head --kv-cache-dtype-skip-layers 1"));

        // An absolute budget of 1.5e-3 nats: e4m3 keeps layer 2 (9e-3), e5m2 layer 0 (3e-3).
        const ImpactRecipe absolute = proposeRecipe({&r}, layers, {scheme("fp8_e4m3/tensor"), scheme("fp8_e5m2/tensor")}, 1.5e-3);
        QCOMPARE(absolute.schemes[0].keep, (std::vector<std::string>{kLayers[2]}));
        QCOMPARE(absolute.schemes[1].keep, (std::vector<std::string>{kLayers[0]}));
        QCOMPARE(absolute.arguments, std::string("--kv-cache-dtype fp8_e4m3 --kv-cache-dtype-skip-layers 2"));  // tie: the first
    }

    // No noise row and no budget: nothing is judged within, so no recipe; a scheme vLLM lacks is
    // scored but never proposed.
    void nothingProposedWithoutAJudgeOrAName()
    {
        const ImpactRecord r = record({{{TransplantKind::Scheme, kLayers[0], "fp8_e4m3/tensor"}, 1e-4},
                                       {{TransplantKind::Baseline, kLayers[0], {}}, 1e-3},
                                       {{TransplantKind::Scheme, kLayers[0], "int4/g32"}, 1e-4}});
        const ImpactRecipe byName = proposeRecipe({&r}, {kLayers[0]}, {scheme("int4/g32")});
        QVERIFY(!byName.chosen);
        QVERIFY(byName.schemes[0].layers[0].within);
        const ImpactRecord bare = record({{{TransplantKind::Scheme, kLayers[0], "fp8_e4m3/tensor"}, 1e-4}});
        const ImpactRecipe unjudged = proposeRecipe({&bare}, {kLayers[0]}, {scheme("fp8_e4m3/tensor")});
        QVERIFY(!unjudged.chosen);
        QCOMPARE(unjudged.schemes[0].keep, (std::vector<std::string>{kLayers[0]}));
    }

    // A model whose KV head 0 of layers 1 and 4 is 2^-16 of the others: one e4m3 scale per
    // tensor crushes it. The what-if's relative error calls those layers hurt, and their output
    // KL (measured by the synth) puts them beyond the default budget: the recipe keeps them.
    void quietHeadsKeptInBf16()
    {
        QTemporaryDir dir;
        const synth::ModelCaptureOptions o = kvtest::quietHeadModel();
        const std::string path = dir.filePath("quiet.h5").toStdString();
        synth::writeModelCapture(path, o);
        const CaptureLoader loader(std::make_shared<BundleReader>(path));
        WhatIfOptions options;
        options.schemes = {scheme("fp8_e4m3/tensor")};
        const WhatIfResult w = runWhatIf(loader, options);
        std::vector<std::string> hurt;
        for (const WhatIfLayer& l : w.schemes[0].layers)
            if (l.hurt)
                hurt.push_back(l.layer);
        const std::vector<std::string> quiet{"model.layers.1.self_attn", "model.layers.4.self_attn"};
        QCOMPARE(hurt, quiet);
        std::vector<ImpactRecord> records;
        std::vector<const ImpactRecord*> pointers;
        for (const PromptInfo& p : loader.prompts())
            records.push_back(*loader.impact(p.id));
        for (const ImpactRecord& r : records)
            pointers.push_back(&r);
        const ImpactRecipe recipe = proposeRecipe(pointers, w.layers, options.schemes);
        for (const SchemeLayerImpact& l : recipe.schemes[0].layers)
            qInfo("%s: KL median %.3g (noise %.3g)", l.layer.c_str(), l.kl.klMedian, l.noise->klMedian);
        QCOMPARE(recipe.schemes[0].keep, quiet);
        QCOMPARE(recipe.arguments, std::string("--kv-cache-dtype fp8_e4m3 --kv-cache-dtype-skip-layers 1 4"));
    }
};

QTEST_APPLESS_MAIN(TestImpactRecipe)
#include "tst_impact_recipe.moc"
