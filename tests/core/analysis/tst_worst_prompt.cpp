// The across-prompts map's click, worked by hand: three prompts of known lengths with BC vs
// noise values placed at the cells a generation index reaches; which prompt each question
// leads to is written out beside it.

#include "analysis/worst_prompt.h"

#include <QTest>

#include <cmath>

using namespace kvscope;

namespace {

// A three-way prompt of `layers` layers and `tokens` tokens, `promptLen` of them prefill,
// every BC vs noise 1 (the engine indistinguishable from the noise) unless set.
PromptAnalysis prompt(std::int64_t promptLen, std::int64_t tokens, int layers = 3)
{
    PromptAnalysis p;
    p.promptLen = promptLen;
    p.tokens = tokens;
    p.heads = 1;
    p.threeWay = true;
    for (int l = 0; l < layers; ++l)
        p.layers.push_back("model.layers." + std::to_string(l) + ".self_attn");
    p.allocate();
    for (auto& part : p.bcVsNoise)
        for (float& v : part)
            v = 1.0f;
    return p;
}

void setBc(PromptAnalysis& p, KvPart part, int layer, std::int64_t token, float value)
{
    p.bcVsNoise[std::size_t(part)][std::size_t(layer) * std::size_t(p.tokens) + std::size_t(token)] = value;
}

}  // namespace

class TestWorstPrompt : public QObject {
    Q_OBJECT

private slots:
    void lowestBcWins()
    {
        // Prompt lengths 4, 6, 5: generation index 2 is token 6, 8 and 7 of each.
        std::vector<PromptAnalysis> prompts{prompt(4, 8), prompt(6, 9), prompt(5, 9)};
        setBc(prompts[0], KvPart::K, 1, 6, 0.9f);
        setBc(prompts[1], KvPart::K, 1, 8, 0.4f);
        setBc(prompts[2], KvPart::K, 1, 7, 0.6f);
        setBc(prompts[2], KvPart::V, 1, 7, 0.1f);  // V is another question
        const auto k = worstPromptAt(prompts, KvPart::K, 1, 2);
        QVERIFY(k);
        QCOMPARE(k->prompt, 1);
        QCOMPARE(k->token, std::int64_t(8));
        const auto v = worstPromptAt(prompts, KvPart::V, 1, 2);
        QVERIFY(v);
        QCOMPARE(v->prompt, 2);
        QCOMPARE(v->token, std::int64_t(7));
    }

    void promptsThatDoNotReachAreSkipped()
    {
        // Generation index 3: token 7 of prompt 0 (8 tokens), token 9 of prompt 1 (only 9
        // tokens: 0..8, out), token 8 of prompt 2; prompt 2 has 2 layers, so layer 2 is not there.
        std::vector<PromptAnalysis> prompts{prompt(4, 8), prompt(6, 9), prompt(5, 9, 2)};
        setBc(prompts[0], KvPart::K, 2, 7, 0.8f);
        setBc(prompts[1], KvPart::K, 2, 8, 0.0f);  // generation index 2 of prompt 1, not 3
        const auto cell = worstPromptAt(prompts, KvPart::K, 2, 3);
        QVERIFY(cell);
        QCOMPARE(cell->prompt, 0);
        QCOMPARE(cell->token, std::int64_t(7));
        // Generation index 4: token 8 of prompt 0 (out), 10 of prompt 1 (out), 9 of prompt 2 (out).
        QVERIFY(!worstPromptAt(prompts, KvPart::K, 0, 4));
        QVERIFY(!worstPromptAt(prompts, KvPart::K, 0, -1));
        QVERIFY(!worstPromptAt(prompts, KvPart::K, 3, 0));  // no prompt has layer 3
    }

    void twoWayPromptsHaveNoBcVsNoise()
    {
        std::vector<PromptAnalysis> prompts{prompt(4, 8), prompt(4, 8)};
        prompts[0].threeWay = false;
        setBc(prompts[0], KvPart::K, 0, 5, 0.0f);  // would win, but means nothing two-way
        setBc(prompts[1], KvPart::K, 0, 5, 0.7f);
        const auto cell = worstPromptAt(prompts, KvPart::K, 0, 1);
        QVERIFY(cell);
        QCOMPARE(cell->prompt, 1);
        prompts[1].threeWay = false;
        QVERIFY(!worstPromptAt(prompts, KvPart::K, 0, 1));
    }

    void missingValuesLoseAndTiesGoToTheFirst()
    {
        const float nan = std::nanf("");
        std::vector<PromptAnalysis> prompts{prompt(4, 8), prompt(4, 8), prompt(4, 8)};
        // Prompt 0 has no value (NaN), 1 and 2 have the same: 1, the first of them.
        setBc(prompts[0], KvPart::K, 0, 6, nan);
        setBc(prompts[1], KvPart::K, 0, 6, 0.5f);
        setBc(prompts[2], KvPart::K, 0, 6, 0.5f);
        QCOMPARE(worstPromptAt(prompts, KvPart::K, 0, 2)->prompt, 1);
        // A NaN after a number does not replace it.
        setBc(prompts[0], KvPart::K, 0, 6, 0.9f);
        setBc(prompts[1], KvPart::K, 0, 6, nan);
        setBc(prompts[2], KvPart::K, 0, 6, nan);
        QCOMPARE(worstPromptAt(prompts, KvPart::K, 0, 2)->prompt, 0);
        // None has a value: the first that reaches there stands.
        setBc(prompts[0], KvPart::K, 0, 6, nan);
        QCOMPARE(worstPromptAt(prompts, KvPart::K, 0, 2)->prompt, 0);
    }
};

QTEST_MAIN(TestWorstPrompt)
#include "tst_worst_prompt.moc"
