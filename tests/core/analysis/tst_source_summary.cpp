// The analysis split by where each position's KV came from, worked by hand: a three-way prompt
// whose cells are a tenth of a floor everywhere but at the two positions a connector loaded.

#include "analysis/source_summary.h"
#include "quiet_prompt.h"

#include <QTest>

#include <cmath>

using namespace kvscope;
using namespace kvtest;

namespace {

// 8 positions (prompt 6, 2 decode steps), 2 layers x 2 heads; base L-inf 1e-2, actual 1e-3.
PromptAnalysis prompt()
{
    return quietPrompt(8, 6, 2);
}

void setLinf(PromptAnalysis& p, KvPart part, int layer, std::int64_t token, int head, float value)
{
    setMetric(p, part, MetricKind::Linf, layer, token, head, value);
}

std::vector<ProvenanceRange> provenance()
{
    ProvenanceRange prefill{0, 4, ProvenanceKind::Prefill};
    prefill.chunk = 0;
    ProvenanceRange loaded{4, 6, ProvenanceKind::External};
    loaded.connector = "NixlConnector";
    ProvenanceRange step0{6, 7, ProvenanceKind::Decode}, step1{7, 8, ProvenanceKind::Decode};
    step0.step = 0;
    step1.step = 1;
    return {prefill, loaded, step0, step1};
}

}  // namespace

class TestSourceSummary : public QObject {
    Q_OBJECT

private slots:
    void eachSourceItsOwnCells()
    {
        PromptAnalysis p = prompt();
        p.provenance = provenance();
        // Layer 1: K of head 1 at positions 4 and 5 is 0.3 (30 floors of 1e-2), V of head 0 at
        // position 5 is 0.12 (12 floors).
        setLinf(p, KvPart::K, 1, 4, 1, 0.3f);
        setLinf(p, KvPart::K, 1, 5, 1, 0.3f);
        setLinf(p, KvPart::V, 1, 5, 0, 0.12f);
        p.nonFinite.push_back({0, 7, 0, KvPart::V, "actual", "nan"});
        // Off above 6 floors in layer 0 and 20 in layer 1: the V cell (12) is not off.
        const std::vector<SourceSummary> sources = summarizeBySource(p, p.provenance, {6.0, 20.0});
        QCOMPARE(sources.size(), std::size_t(3));

        QCOMPARE(QString::fromStdString(sources[0].source), QString("prefill (chunk 0)"));
        QCOMPARE(sources[0].positions, std::int64_t(4));
        QCOMPARE(sources[0].cells, std::int64_t(4 * 2 * 2));  // positions x layers x K/V
        QCOMPARE(sources[0].offCells, std::int64_t(0));
        QVERIFY(std::abs(double(sources[0].worstRatio) - 0.1) < 1e-6);

        const SourceSummary& loaded = sources[1];
        QCOMPARE(QString::fromStdString(loaded.source), QString("external (NixlConnector)"));
        QCOMPARE(loaded.kind, ProvenanceKind::External);
        QCOMPARE(QString::fromStdString(spanText(loaded.spans)), QString("4-5"));
        QCOMPARE(loaded.cells, std::int64_t(2 * 2 * 2));
        QCOMPARE(loaded.offCells, std::int64_t(2));  // K at 4 and 5 (30 > 20); V (12) is not
        QVERIFY(std::abs(double(loaded.worstRatio) - 30.0) < 1e-4);
        QCOMPARE(loaded.worstLayer, 1);
        QCOMPARE(loaded.worstToken, std::int64_t(4));  // the first of two equal ones
        QCOMPARE(loaded.worstPart, KvPart::K);
        QVERIFY(std::abs(double(loaded.layerWorst[0]) - 0.1) < 1e-6);
        QVERIFY(std::abs(double(loaded.layerWorst[1]) - 30.0) < 1e-4);

        // Decode steps are one source, one span.
        QCOMPARE(QString::fromStdString(sources[2].source), QString("decode"));
        QCOMPARE(QString::fromStdString(spanText(sources[2].spans)), QString("6-7"));
        QCOMPARE(sources[2].nonFinite, std::int64_t(1));
        QCOMPARE(sources[2].offCells, std::int64_t(0));
    }

    void positionsWithoutARangeAreUnknown()
    {
        PromptAnalysis p = prompt();
        ProvenanceRange loaded{2, 4, ProvenanceKind::External};
        loaded.connector = "LMCacheConnectorV1";
        const std::vector<SourceSummary> sources = summarizeBySource(p, {loaded}, {6.0, 6.0});
        QCOMPARE(sources.size(), std::size_t(2));
        QCOMPARE(QString::fromStdString(sources[0].source), QString("unknown"));
        QCOMPARE(QString::fromStdString(spanText(sources[0].spans)), QString("0-1, 4-7"));
        QCOMPARE(sources[0].positions, std::int64_t(6));
        QCOMPARE(QString::fromStdString(sources[1].source), QString("external (LMCacheConnectorV1)"));
    }

    void prefillChunksAndPreemptionsApart()
    {
        ProvenanceRange a{0, 4, ProvenanceKind::Prefill}, b{4, 8, ProvenanceKind::Prefill};
        a.chunk = 0;
        b.chunk = 1;
        QCOMPARE(QString::fromStdString(sourceOf(a)), QString("prefill (chunk 0)"));
        QCOMPARE(QString::fromStdString(sourceOf(b)), QString("prefill (chunk 1)"));
        ProvenanceRange again{0, 4, ProvenanceKind::Recomputed};
        again.preemption = 1;
        QCOMPARE(QString::fromStdString(sourceOf(again)), QString("recomputed (after preemption 1)"));
        ProvenanceRange hit{0, 4, ProvenanceKind::PrefixCache};
        hit.blocks = {17};
        QCOMPARE(QString::fromStdString(sourceOf(hit)), QString("prefix_cache"));
    }

    void noProvenanceNoSources()
    {
        PromptAnalysis p = prompt();
        QVERIFY(summarizeBySource(p, {}, {6.0, 6.0}).empty());
    }
};

QTEST_GUILESS_MAIN(TestSourceSummary)
#include "tst_source_summary.moc"
