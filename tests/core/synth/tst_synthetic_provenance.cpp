// kvscope synth --provenance: the spec turned into the prompt's provenance attribute, checked
// range by range against the spec as written by hand.

#include "format/provenance.h"
#include "synth/synthetic_provenance.h"

#include <QTest>

using namespace kvscope;

class TestSyntheticProvenance : public QObject {
    Q_OBJECT

private slots:
    void segmentsInOrderThenDecodeSteps()
    {
        const std::string json = synth::provenanceFromSpec("prefix_cache:16,external=NixlConnector:32,prefill:8,prefill", 64, 3);
        const std::vector<ProvenanceRange> r = parseProvenance(json, 67);
        QCOMPARE(r.size(), std::size_t(4 + 3));
        QCOMPARE(r[0].kind, ProvenanceKind::PrefixCache);
        QCOMPARE(r[0].start, std::int64_t(0));
        QCOMPARE(r[0].end, std::int64_t(16));
        QCOMPARE(r[1].kind, ProvenanceKind::External);
        QCOMPARE(QString::fromStdString(r[1].connector), QString("NixlConnector"));
        QCOMPARE(r[1].end, std::int64_t(48));
        QCOMPARE(*r[2].chunk, std::int64_t(0));
        QCOMPARE(r[2].end, std::int64_t(56));
        QCOMPARE(*r[3].chunk, std::int64_t(1));  // the rest of the prompt: 56-63
        QCOMPARE(r[3].end, std::int64_t(64));
        for (int s = 0; s < 3; ++s) {
            QCOMPARE(r[std::size_t(4 + s)].kind, ProvenanceKind::Decode);
            QCOMPARE(r[std::size_t(4 + s)].start, std::int64_t(64 + s));
            QCOMPARE(*r[std::size_t(4 + s)].step, std::int64_t(s));
        }
    }

    void aShortPromptCutsTheSegments()
    {
        const std::vector<ProvenanceRange> r =
            parseProvenance(synth::provenanceFromSpec("prefill:10,external=X:10,prefill", 15, 0), 15);
        QCOMPARE(r.size(), std::size_t(2));  // the last segment has nothing left
        QCOMPARE(r[1].start, std::int64_t(10));
        QCOMPARE(r[1].end, std::int64_t(15));
    }

    void badSpecsSayWhat()
    {
        for (const char* spec : {"external:4", "prefill=X:4", "decode:4", "prefil:4", "prefill:0", "prefill:x"}) {
            try {
                synth::provenanceFromSpec(spec, 16, 2);
                QFAIL(spec);
            } catch (const std::invalid_argument& e) {
                QVERIFY2(QString(e.what()).contains("--provenance: segment"), e.what());
            }
        }
    }
};

QTEST_GUILESS_MAIN(TestSyntheticProvenance)
#include "tst_synthetic_provenance.moc"
