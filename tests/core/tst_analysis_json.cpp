// The analysis as strict JSON: complete, no NaN, nulls where there is no data.

#include "analysis/analysis_json.h"
#include "analysis/analyzer.h"
#include "metric_reference.h"
#include "test_support.h"

#include <nlohmann/json.hpp>

#include <QTemporaryDir>
#include <QTest>

#include <limits>
#include <sstream>

using namespace kvscope;
using namespace kvtest;

class TestAnalysisJson : public QObject {
    Q_OBJECT

private slots:
    void initTestCase();
    void jsonIsStrictAndComplete();
    void infinitiesAreNullToo();

private:
    QTemporaryDir m_dir;
    std::string m_demo;
};

void TestAnalysisJson::initTestCase()
{
    m_demo = m_dir.filePath("demo.h5").toStdString();
    writeSmallCapture(m_demo);
}

void TestAnalysisJson::jsonIsStrictAndComplete()
{
    auto reader = std::make_shared<BundleReader>(m_demo);
    const AnalysisResult result = analyzeBundle(reader);
    std::ostringstream text;
    writeAnalysisJson(result, text);
    QVERIFY(text.str().find("NaN") == std::string::npos);
    QVERIFY(text.str().find("nan") == std::string::npos);
    const nlohmann::json j = nlohmann::json::parse(text.str());  // strict: throws on NaN, Infinity
    QCOMPARE(j["format"].get<std::string>(), std::string("kvscope-analysis"));
    QCOMPARE(j["prompts"].size(), std::size_t(3));
    const auto& p = j["prompts"][1];
    const PromptAnalysis& r = result.prompts[1];
    QCOMPARE(p["prompt_len"].get<std::int64_t>(), r.promptLen);
    QCOMPARE(p["num_tokens"].get<std::int64_t>(), r.tokens);
    QCOMPARE(p["num_heads"].get<int>(), r.heads);
    QCOMPARE(p["layer_names"].get<std::vector<std::string>>(), r.layers);
    QCOMPARE(p["divergence_positions"].get<std::vector<std::int64_t>>(), std::vector<std::int64_t>{31 + 4});
    for (const char* name : {"k_cos", "v_cos", "k_linf", "v_linf", "k_l2", "v_l2", "base_k_linf", "base_v_linf",
                             "base_k_l2", "base_v_l2"}) {
        const auto& m = p["metrics"][name];
        QCOMPARE(m.size(), r.layers.size());
        QCOMPARE(m[0].size(), std::size_t(r.tokens));
        QCOMPARE(m[0][0].size(), std::size_t(r.heads));
    }
    int nulls = 0;
    for (std::size_t l = 0; l < r.layers.size(); ++l)
        for (std::int64_t t = 0; t < r.tokens; ++t)
            for (int h = 0; h < r.heads; ++h) {
                const auto& cell = p["metrics"]["k_linf"][l][std::size_t(t)][std::size_t(h)];
                const float v = r.value(Metric::KLinf, int(l), t, h);
                if (std::isnan(v)) {
                    QVERIFY(cell.is_null());
                    ++nulls;
                } else {
                    QCOMPARE(cell.get<float>(), v);  // shortest round-trip form is exact
                }
            }
    QVERIFY(nulls > 0);  // sliding-window layers and the last position have no data
    QCOMPARE(p["bc"]["k_bc"].size(), r.layers.size());
    QVERIFY(p["bc"]["k_bc"][0][0].is_null());  // outside the window
    const auto& a = j["aggregate"];
    QCOMPARE(a["num_generation_indices"].get<int>(), 12);
    QCOMPARE(a["combined_v_bc"].size(), r.layers.size());
    QCOMPARE(a["combined_k_bc_vs_noise"].size(), r.layers.size());
    QCOMPARE(a["v_bc_vs_noise"][2].size(), std::size_t(12));
    QCOMPARE(p["bc_vs_noise"]["v"].size(), r.layers.size());
    QCOMPARE(p["bc_vs_noise"]["k"][0].size(), std::size_t(r.tokens));
    QVERIFY(p["bc_vs_noise"]["k"][0][0].is_null());  // outside the window: no data
    QCOMPARE(a["k_bc"][2].size(), std::size_t(12));
}

void TestAnalysisJson::infinitiesAreNullToo()
{
    AnalysisResult result = analyzeBundle(std::make_shared<BundleReader>(m_demo));
    PromptAnalysis& p = result.prompts.front();
    const float inf = std::numeric_limits<float>::infinity();
    p.metrics[std::size_t(Metric::KLinf)][0] = inf;
    p.metrics[std::size_t(Metric::KLinf)][1] = -inf;
    p.bc[0][0] = inf;
    Divergence d;
    d.position = 3;
    d.logitGap = std::numeric_limits<double>::infinity();
    d.ulpBound = std::nan("");
    p.divergences.push_back(d);
    if (result.aggregate)
        result.aggregate->combined[0][0] = -inf;
    std::ostringstream text;
    writeAnalysisJson(result, text);
    const nlohmann::json j = nlohmann::json::parse(text.str());  // strict
    const nlohmann::json& first = j["prompts"][0];
    QVERIFY(first["metrics"]["k_linf"][0][0][0].is_null());
    QVERIFY(first["metrics"]["k_linf"][0][0][1].is_null());
    QVERIFY(first["bc"]["k_bc"][0][0].is_null());
    QVERIFY(first["divergences"].back()["logit_gap"].is_null());
    QVERIFY(first["divergences"].back()["ulp_bound"].is_null());
    if (result.aggregate)
        QVERIFY(j["aggregate"]["combined_k_bc"][0].is_null());
}

QTEST_APPLESS_MAIN(TestAnalysisJson)
#include "tst_analysis_json.moc"
