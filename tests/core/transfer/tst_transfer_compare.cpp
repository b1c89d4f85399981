// kvscope transfer's engine: hand-built producer / consumer captures (tests/support/transfer_pair.h)
// of the same requests at other physical blocks. Identical ones give nothing; each fault injected
// into one block of the consumer is found there and named with its parameters (a layout misread
// with two KV heads, where shapes agree; a block offset; another request's block; a stale block;
// a cast and a rescale; a block written in part); a change nothing explains is measured; a
// declared bf16 -> fp8 conversion is judged in fp8's rounding; positions missing, partial and
// extra are listed; captures that cannot be compared are refused, naming what differs.

#include "format/bundle_error.h"
#include "format/bundle_reader.h"
#include "format/provenance.h"
#include "kv/capture_loader.h"
#include "kv/prompt_match.h"
#include "transfer/block_comparison.h"
#include "transfer/layer_blocks.h"
#include "transfer/producer_rows.h"
#include "transfer/transfer_compare.h"
#include "transfer/transfer_hypotheses.h"
#include "transfer/transfer_json.h"
#include "transfer/transfer_pairing.h"
#include "transfer/transferred_positions.h"
#include "transfer_pair.h"

#include <QTemporaryDir>
#include <QTest>

#include <nlohmann/json.hpp>

#include <cmath>
#include <fstream>
#include <sstream>

using namespace kvscope;
using namespace kvtest;

namespace {

// The same side at other physical blocks (the consumer's engine allocates its own).
Side movedTo(Side side, int firstBlock)
{
    for (std::size_t i = 0; i < side.prompts.size(); ++i)
        for (std::size_t e = 0; e < side.prompts[i].physical.size(); ++e)
            side.prompts[i].physical[e] = std::int32_t(firstBlock + 8 * int(i) + int(e));
    return side;
}

// The one changed block of a result, checked to be the only one.
const BlockFinding& onlyChange(const TransferResult& r)
{
    if (r.changedBlocks != 1 || r.changed.size() != 1)
        throw std::runtime_error("expected one changed block, found " + std::to_string(r.changedBlocks));
    return r.changed.front();
}

}  // namespace

class TestTransferCompare : public QObject {
    Q_OBJECT

private slots:
    void initTestCase() { QVERIFY(m_dir.isValid()); }
    void promptsMatchByTokens();
    void identicalCapturesExitZero();
    void layoutMisreadWithTwoHeads();
    void kvSwappedAndInterleaved();
    void layoutMisreadOnOneRank();
    void blockOffset();
    void anotherRequestsBlock();
    void staleBlock();
    void castAndRescale();
    void notWrittenWhenRead();
    void unexplainedChangeIsMeasured();
    void declaredFp8ConversionWithinFloors();
    void wrongScaleIsAChange();
    void missingPartialAndExtraPositions();
    void provenanceLimitsTheComparedPositions();
    void incomparableCaptures();
    void jsonNamesTheFirstChange();

private:
    std::string path(const std::string& name) const { return m_dir.filePath(QString::fromStdString(name)).toStdString(); }
    // Writes both sides and compares them.
    TransferResult compare(const std::string& name, const Side& producer, const Side& consumer)
    {
        writeSide(path(name + "_p.h5"), producer);
        writeSide(path(name + "_c.h5"), consumer);
        return compareTransfer(path(name + "_p.h5"), path(name + "_c.h5"));
    }
    QTemporaryDir m_dir;
};

void TestTransferCompare::promptsMatchByTokens()
{
    // B's prompts in B's order, each matched with the first unused A prompt of its tokens.
    const std::vector<std::int64_t> x{1, 2}, y{3}, z{4, 5}, empty{};
    const PromptMatch m = matchPromptsByTokens({&x, &y, &x}, {&y, &x, &x, &z, &x, &empty});
    QCOMPARE(m.pairs, (std::vector<std::pair<std::size_t, std::size_t>>{{1, 0}, {0, 1}, {2, 2}}));
    QCOMPARE(m.onlyA, std::vector<std::size_t>{});
    QCOMPARE(m.onlyB, (std::vector<std::size_t>{3, 4, 5}));
    QCOMPARE(describeTokenIds({1, 2, 3, 4, 5, 6, 7}), std::string("[1, 2, 3, 4, 5, 6, ...] (7 tokens)"));
}

void TestTransferCompare::identicalCapturesExitZero()
{
    const TransferShape shape;
    const Side producer = makeSide(shape, 2, 40, 0);
    Side consumer = movedTo(producer, 30);
    std::swap(consumer.prompts[0], consumer.prompts[1]);  // another order, other ids: matched by tokens
    consumer.prompts[0].id = "request-b";
    consumer.prompts[1].id = "request-a";
    const TransferResult r = compare("identical", producer, consumer);
    QCOMPARE(r.exitStatus(), 0);
    QCOMPARE(r.changedBlocks, std::size_t(0));
    QVERIFY(!r.firstChange);
    QCOMPARE(r.prompts.size(), std::size_t(2));
    QCOMPARE(r.prompts[0].producer, std::string("p1"));
    QCOMPARE(r.prompts[0].consumer, std::string("request-b"));
    QCOMPARE(r.comparedPositions, std::int64_t(80));
    QCOMPARE(r.prompts[1].positions.transferred, (std::vector<PositionRange>{{0, 40}}));
    QVERIFY(r.prompts[1].positions.missing.empty() && r.prompts[1].positions.extra.empty() &&
            r.prompts[1].positions.partial.empty());
    QCOMPARE(r.layers.size(), std::size_t(2));
    QVERIFY(!r.layers[0].judgedIn[0] && !r.layers[0].judgedIn[1]);
}

void TestTransferCompare::layoutMisreadWithTwoHeads()
{
    // Two KV heads: the consumer's block has the producer's shape, but its rows were laid
    // head-major and read token-major: consumer (h, t) holds head-major row t * 2 + h.
    const TransferShape shape;  // 2 heads, block 16
    const Side producer = makeSide(shape, 2, 40, 0);
    Side consumer = movedTo(producer, 30);
    SidePrompt& p = consumer.prompts[0];
    const SidePrompt& from = producer.prompts[0];
    for (int part = 0; part < 2; ++part)
        for (int h = 0; h < 2; ++h)
            for (int t = 0; t < 16; ++t) {
                const int i = t * 2 + h;
                std::copy_n(from.row(shape, 1, part, 1, i / 16, i % 16), 8, p.row(shape, 1, part, 1, h, t));
            }
    const TransferResult r = compare("layout", producer, consumer);
    QCOMPARE(r.exitStatus(), 1);
    const BlockFinding& f = onlyChange(r);
    QCOMPARE(f.block.layer, std::size_t(1));
    QCOMPARE(f.block.block, std::int64_t(1));
    QCOMPARE(f.block.producerBlock, std::int64_t(1));
    QCOMPARE(f.block.consumerBlock, std::int64_t(31));
    QCOMPARE(f.explanation.name, std::string("layout"));
    QCOMPARE(f.explanation.writtenAs, std::string("head_major"));
    QCOMPARE(f.explanation.readAs, std::string("token_major"));
    QCOMPARE(f.block.heads, (std::vector<int>{0, 1}));
    // Row (0, 0) and row (1, 15) are where they were: the rest moved.
    QCOMPARE(f.block.changedPositions.front(), std::int64_t(16));
    QVERIFY(!f.block.wholeBlock() || f.block.changedPositions.size() == 16);
    QCOMPARE(r.byExplanation.at("layout"), std::size_t(1));

    // The other way: laid token-major, read head-major: consumer (h, t) holds token-major row
    // h * 16 + t, i.e. token (h * 16 + t) / 2 of head (h * 16 + t) % 2.
    Side other = movedTo(producer, 30);
    for (int part = 0; part < 2; ++part)
        for (int h = 0; h < 2; ++h)
            for (int t = 0; t < 16; ++t) {
                const int j = h * 16 + t;
                std::copy_n(from.row(shape, 0, part, 0, j % 2, j / 2), 8, other.prompts[0].row(shape, 0, part, 0, h, t));
            }
    const TransferResult r2 = compare("layout2", producer, other);
    QCOMPARE(onlyChange(r2).explanation.writtenAs, std::string("token_major"));
    QCOMPARE(onlyChange(r2).explanation.readAs, std::string("head_major"));
}

void TestTransferCompare::kvSwappedAndInterleaved()
{
    const TransferShape shape;
    const Side producer = makeSide(shape, 1, 32, 0);
    Side swapped = movedTo(producer, 20);
    for (int h = 0; h < 2; ++h)
        for (int t = 0; t < 16; ++t) {
            std::copy_n(producer.prompts[0].row(shape, 0, 1, 0, h, t), 8, swapped.prompts[0].row(shape, 0, 0, 0, h, t));
            std::copy_n(producer.prompts[0].row(shape, 0, 0, 0, h, t), 8, swapped.prompts[0].row(shape, 0, 1, 0, h, t));
        }
    const TransferResult r1 = compare("swapped", producer, swapped);

    const TransferExplanation& x = onlyChange(r1).explanation;
    QCOMPARE(x.name, std::string("layout"));
    QCOMPARE(x.writtenAs, std::string("k_v"));
    QCOMPARE(x.readAs, std::string("v_k"));

    // K and V written interleaved row by row (K row 0, V row 0, K row 1, ...), read as all of K
    // then all of V: the consumer's K row i is memory row i, its V row i memory row 32 + i.
    Side interleaved = movedTo(producer, 20);
    const auto memoryRow = [&](int m) {  // head-major rows of 2 heads x 16: row m of the interleaved memory
        const int part = m % 2, i = m / 2;
        return producer.prompts[0].row(shape, 1, part, 1, i / 16, i % 16);
    };
    for (int i = 0; i < 32; ++i) {
        std::copy_n(memoryRow(i), 8, interleaved.prompts[0].row(shape, 1, 0, 1, i / 16, i % 16));
        std::copy_n(memoryRow(32 + i), 8, interleaved.prompts[0].row(shape, 1, 1, 1, i / 16, i % 16));
    }
    const TransferResult r2 = compare("interleaved", producer, interleaved);

    const BlockFinding& f = onlyChange(r2);
    QCOMPARE(f.explanation.name, std::string("layout"));
    QCOMPARE(f.explanation.writtenAs, std::string("kv_interleaved_rows"));
    QCOMPARE(f.explanation.readAs, std::string("kv_split"));
}

void TestTransferCompare::layoutMisreadOnOneRank()
{
    // Four heads over TP 2: only rank 1's block (heads 2 and 3) was misread, within itself.
    TransferShape shape;
    shape.heads = 4;
    shape.tpSize = 2;
    const Side producer = makeSide(shape, 1, 32, 0);
    Side consumer = movedTo(producer, 20);
    for (int part = 0; part < 2; ++part)
        for (int h = 0; h < 2; ++h)
            for (int t = 0; t < 16; ++t) {
                const int i = t * 2 + h;
                std::copy_n(producer.prompts[0].row(shape, 0, part, 0, 2 + i / 16, i % 16), 8,
                            consumer.prompts[0].row(shape, 0, part, 0, 2 + h, t));
            }
    const TransferResult r3 = compare("rank", producer, consumer);

    const BlockFinding& f = onlyChange(r3);
    QCOMPARE(f.block.heads, (std::vector<int>{2, 3}));
    QCOMPARE(f.explanation.name, std::string("layout"));
    QCOMPARE(f.explanation.writtenAs, std::string("head_major"));
}

void TestTransferCompare::blockOffset()
{
    // The consumer's block 0 holds the producer's block 2 (positions p + 2 x 16).
    const TransferShape shape;
    const Side producer = makeSide(shape, 1, 48, 0);
    Side consumer = movedTo(producer, 20);
    for (int part = 0; part < 2; ++part)
        for (int h = 0; h < 2; ++h)
            for (int t = 0; t < 16; ++t)
                std::copy_n(producer.prompts[0].row(shape, 1, part, 2, h, t), 8, consumer.prompts[0].row(shape, 1, part, 0, h, t));
    const TransferResult r4 = compare("offset", producer, consumer);

    const BlockFinding& f = onlyChange(r4);
    QCOMPARE(f.explanation.name, std::string("block_offset"));
    QCOMPARE(f.explanation.offsetBlocks, std::int64_t(2));
    QVERIFY(f.block.wholeBlock());
    QVERIFY(f.explanation.signature.searched);
}

void TestTransferCompare::anotherRequestsBlock()
{
    // Prompt p1's block 2 on the consumer holds prompt p0's block 2 (rows 32-39 written).
    const TransferShape shape;
    const Side producer = makeSide(shape, 2, 40, 0);
    Side consumer = movedTo(producer, 30);
    consumer.prompts[1].blocks[0] = consumer.prompts[1].blocks[0];
    for (int part = 0; part < 2; ++part)
        for (int h = 0; h < 2; ++h)
            for (int t = 0; t < 16; ++t)
                std::copy_n(producer.prompts[0].row(shape, 0, part, 2, h, t), 8, consumer.prompts[1].row(shape, 0, part, 2, h, t));
    const TransferResult r5 = compare("other", producer, consumer);

    const BlockFinding& f = onlyChange(r5);
    QCOMPARE(f.explanation.name, std::string("other_request"));
    QVERIFY(f.explanation.source.has_value());
    QCOMPARE(f.explanation.source->prompt, std::string("p0"));
    QCOMPARE(f.explanation.source->block, std::int64_t(2));
    QCOMPARE(f.explanation.source->physicalBlock, std::int64_t(2));  // p0's third block
    QCOMPARE(f.block.producerBlock, std::int64_t(10));              // p1's own
    QCOMPARE(f.block.changedPositions, (std::vector<std::int64_t>{32, 33, 34, 35, 36, 37, 38, 39}));
}

void TestTransferCompare::staleBlock()
{
    // The producer's physical block 9 held request "old" before p1 reused it; the consumer read
    // it before p1's data arrived.
    const TransferShape shape;
    Side producer = makeSide(shape, 2, 40, 0);  // p1 at blocks 8, 9, 10
    producer.prompts.insert(producer.prompts.begin(), makePrompt(shape, "old", 9, 32, 9, 40));  // blocks 9, 49
    Side consumer = movedTo(makeSide(shape, 2, 40, 0), 30);
    for (int part = 0; part < 2; ++part)
        for (int h = 0; h < 2; ++h)
            for (int t = 0; t < 16; ++t)
                std::copy_n(producer.prompts[0].row(shape, 1, part, 0, h, t), 8, consumer.prompts[1].row(shape, 1, part, 1, h, t));
    const TransferResult r = compare("stale", producer, consumer);
    QCOMPARE(r.onlyProducer, std::vector<std::string>{"old"});
    const BlockFinding& f = onlyChange(r);
    QCOMPARE(f.explanation.name, std::string("stale_block"));
    QCOMPARE(f.explanation.source->prompt, std::string("old"));
    QCOMPARE(f.explanation.source->physicalBlock, std::int64_t(9));
    QCOMPARE(f.block.producerBlock, std::int64_t(9));
}

void TestTransferCompare::castAndRescale()
{
    const TransferShape shape;
    const Side producer = makeSide(shape, 2, 40, 0);
    Side consumer = movedTo(producer, 30);
    // Block 0 of p0, layer 0: cast through fp8 e4m3 (the consumer still stores bf16).
    for (int part = 0; part < 2; ++part)
        for (int h = 0; h < 2; ++h)
            for (int t = 0; t < 16; ++t) {
                float* row = consumer.prompts[0].row(shape, 0, part, 0, h, t);
                for (int d = 0; d < 8; ++d)
                    row[d] = roundToDType(DType::Float8E4M3, row[d]);
            }
    // Block 1 of p1, layer 1: K doubled (exact in bf16), V as it was.
    for (int h = 0; h < 2; ++h)
        for (int t = 0; t < 16; ++t) {
            float* row = consumer.prompts[1].row(shape, 1, 0, 1, h, t);
            for (int d = 0; d < 8; ++d)
                row[d] *= 2;
        }
    const TransferResult r = compare("cast", producer, consumer);
    QCOMPARE(r.changedBlocks, std::size_t(2));
    QCOMPARE(r.changed[0].explanation.name, std::string("conversion"));
    QCOMPARE(r.changed[0].explanation.format, std::string("float8_e4m3fn"));
    QCOMPARE(r.changed[1].explanation.name, std::string("scale"));
    QCOMPARE(r.changed[1].explanation.factor[0], 2.0);
    QCOMPARE(r.changed[1].explanation.factor[1], 1.0);
    QCOMPARE(r.changed[1].block.parts, (std::array<bool, 2>{true, false}));
}

void TestTransferCompare::notWrittenWhenRead()
{
    const TransferShape shape;
    const Side producer = makeSide(shape, 2, 48, 0);
    Side consumer = movedTo(producer, 30);
    // p0, layer 0, block 1: the first 5 rows written, the rest zeros.
    for (int part = 0; part < 2; ++part)
        for (int h = 0; h < 2; ++h)
            for (int t = 5; t < 16; ++t)
                std::fill_n(consumer.prompts[0].row(shape, 0, part, 1, h, t), 8, 0.0f);
    // p1, layer 1, block 2: nothing written (zeros).
    for (int part = 0; part < 2; ++part)
        for (int h = 0; h < 2; ++h)
            for (int t = 0; t < 16; ++t)
                std::fill_n(consumer.prompts[1].row(shape, 1, part, 2, h, t), 8, 0.0f);
    // p1, layer 0, block 0: the first 3 rows written, the rest another request's old data (p0's).
    for (int part = 0; part < 2; ++part)
        for (int h = 0; h < 2; ++h)
            for (int t = 3; t < 16; ++t)
                std::copy_n(producer.prompts[0].row(shape, 0, part, 2, h, t), 8, consumer.prompts[1].row(shape, 0, part, 0, h, t));
    const TransferResult r = compare("unwritten", producer, consumer);
    QCOMPARE(r.changedBlocks, std::size_t(3));
    const TransferExplanation& partly = r.changed[0].explanation;  // layer 0: p0 block 1, then p1 block 0
    QCOMPARE(partly.name, std::string("not_written"));
    QCOMPARE(partly.rest, std::string("zeros"));
    QCOMPARE(partly.rowsWritten, std::int64_t(5));
    QVERIFY(!r.changed[0].block.wholeBlock());
    const TransferExplanation& old = r.changed[1].explanation;
    QCOMPARE(old.name, std::string("not_written"));
    QCOMPARE(old.rest, std::string("old_data"));
    QCOMPARE(old.rowsWritten, std::int64_t(3));
    QCOMPARE(old.source->prompt, std::string("p0"));
    QCOMPARE(old.source->block, std::int64_t(2));
    const TransferExplanation& none = r.changed[2].explanation;
    QCOMPARE(none.name, std::string("not_written"));
    QCOMPARE(none.rowsWritten, std::int64_t(0));
    QVERIFY(r.changed[2].block.wholeBlock());
}

void TestTransferCompare::unexplainedChangeIsMeasured()
{
    const TransferShape shape;
    const Side producer = makeSide(shape, 1, 40, 0);
    Side consumer = movedTo(producer, 30);
    consumer.prompts[0].row(shape, 1, 0, 0, 1, 3)[5] += 0.5f;  // one value of position 3, head 1, K
    const TransferResult r = compare("unexplained", producer, consumer);
    const BlockFinding& f = onlyChange(r);
    QCOMPARE(f.explanation.name, std::string("unexplained"));
    QVERIFY(!f.explanation.explained());
    QCOMPARE(f.block.changedPositions, std::vector<std::int64_t>{3});
    QCOMPARE(f.block.heads, std::vector<int>{1});
    QVERIFY(!f.block.wholeBlock());
    QCOMPARE(f.explanation.signature.changedRows, std::int64_t(1));
    QCOMPARE(f.explanation.signature.zeroRows, std::int64_t(0));
    QVERIFY(f.explanation.signature.searched);
    QCOMPARE(f.explanation.signature.rowsFound, std::int64_t(0));
    QCOMPARE(f.block.maxAbsDifference, 0.5);
    QCOMPARE(r.firstChange->at.position, std::int64_t(3));
    QCOMPARE(r.firstChange->at.head, 1);
    QCOMPARE(r.firstChange->layer, std::size_t(1));
}

void TestTransferCompare::declaredFp8ConversionWithinFloors()
{
    // The producer keeps bf16, the consumer fp8 e4m3 at a scale per layer (values within +-2).
    const TransferShape shape;
    const Side producer = makeSide(shape, 2, 40, 0);
    Side consumer = movedTo(producer, 30);
    consumer.dtype = DType::Float8E4M3;
    consumer.scales = {2.0f / 448, 2.0f / 224};
    const TransferResult r = compare("fp8", producer, consumer);
    QCOMPARE(r.exitStatus(), 0);
    QCOMPARE(r.layers[0].judgedIn[0], std::optional<DType>(DType::Float8E4M3));
    QCOMPARE(r.layers[1].judgedIn[1], std::optional<DType>(DType::Float8E4M3));
    QCOMPARE(r.comparedPositions, std::int64_t(80));

    // The same with one value a step of e4m3 off (more than its rounding): changed.
    Side off = consumer;
    float& v = off.prompts[0].row(shape, 0, 1, 0, 0, 0)[0];
    v = v + std::fabs(v) / 8 + 0.05f;
    QCOMPARE(compare("fp8off", producer, off).exitStatus(), 1);
}

void TestTransferCompare::wrongScaleIsAChange()
{
    const TransferShape shape;
    const Side producer = makeSide(shape, 1, 40, 0);
    Side consumer = movedTo(producer, 30);
    consumer.dtype = DType::Float8E4M3;
    consumer.scales = {2.0f / 448, 2.0f / 448};
    consumer.storedScaleFactor = 2;  // codes made at one scale, twice it recorded
    const TransferResult r = compare("scale", producer, consumer);
    QCOMPARE(r.exitStatus(), 1);
    QCOMPARE(r.changedBlocks, std::size_t(6));  // 3 blocks x 2 layers
    QCOMPARE(r.byExplanation.at("scale"), std::size_t(6));
    QCOMPARE(r.changed[0].explanation.factor[0], 2.0);
    QCOMPARE(r.changed[0].explanation.factor[1], 2.0);
}

void TestTransferCompare::missingPartialAndExtraPositions()
{
    const TransferShape shape;
    const Side producer = makeSide(shape, 2, 40, 0);
    Side consumer = movedTo(producer, 30);
    // p0: only 36 of 40 positions arrived (block 2 in part); p1: decoded 8 more on the consumer.
    SidePrompt& p0 = consumer.prompts[0];
    p0 = makePrompt(shape, "p0", 1, 36, 30);
    p0.tokens = producer.prompts[0].tokens;
    SidePrompt& p1 = consumer.prompts[1];
    p1 = makePrompt(shape, "p1", 2, 48, 38);
    p1.tokens = producer.prompts[1].tokens;
    const TransferResult r = compare("positions", producer, consumer);
    QCOMPARE(r.exitStatus(), 0);
    const TransferredPositions& a = r.prompts[0].positions;
    QCOMPARE(a.transferred, (std::vector<PositionRange>{{0, 36}}));
    QCOMPARE(a.missing, (std::vector<PositionRange>{{36, 40}}));
    QCOMPARE(a.partial.size(), std::size_t(1));
    QCOMPARE(a.partial[0].block, std::int64_t(2));
    QCOMPARE(a.partial[0].producerBlock, std::int64_t(2));
    QCOMPARE(a.partial[0].consumerBlock, std::int64_t(32));
    QCOMPARE(a.partial[0].positions, (PositionRange{32, 40}));
    QCOMPARE(a.partial[0].arrived, (std::vector<PositionRange>{{32, 36}}));
    const TransferredPositions& b = r.prompts[1].positions;
    QCOMPARE(b.transferred, (std::vector<PositionRange>{{0, 40}}));
    QCOMPARE(b.extra, (std::vector<PositionRange>{{40, 48}}));
    QVERIFY(b.missing.empty() && b.partial.empty());
    QCOMPARE(r.comparedPositions, std::int64_t(76));
}

void TestTransferCompare::provenanceLimitsTheComparedPositions()
{
    // The consumer recorded 0-31 as loaded by a connector and 32-39 as its own prefill: a
    // difference there is not a transfer's.
    const TransferShape shape;
    const Side producer = makeSide(shape, 1, 40, 0);
    Side consumer = movedTo(producer, 30);
    consumer.prompts[0].row(shape, 0, 0, 2, 0, 3)[0] += 1.0f;  // position 35
    writeSide(path("prov_p.h5"), producer);
    writeSide(path("prov_c_plain.h5"), consumer);  // the ranges below stand for its provenance
    const std::vector<ProvenanceRange> ranges =
        parseProvenance(R"([{"start": 0, "end": 32, "kind": "external", "connector": "NixlConnector"},
                            {"start": 32, "end": 40, "kind": "prefill", "chunk": 0}])", 40);
    LayerBlocks p = readLayerBlocks(CaptureLoader(std::make_shared<BundleReader>(path("prov_p.h5"))), "p0", 0,
                                    layerName(0));
    LayerBlocks c = readLayerBlocks(CaptureLoader(std::make_shared<BundleReader>(path("prov_c_plain.h5"))), "p0", 0,
                                    layerName(0));
    const TransferredPositions t = classifyPositions(p, c, ranges);
    QCOMPARE(t.transferred, (std::vector<PositionRange>{{0, 32}}));
    QCOMPARE(t.local, (std::vector<PositionRange>{{32, 40}}));
    const std::array<ValueJudge, 2> exact{};
    QVERIFY(compareBlocks(p, c, comparedMask(p, c, ranges), exact).empty());
    QCOMPARE(compareBlocks(p, c, comparedMask(p, c, {}), exact).size(), std::size_t(1));
}

void TestTransferCompare::incomparableCaptures()
{
    const TransferShape shape;
    const Side producer = makeSide(shape, 1, 40, 0);
    writeSide(path("inc_p.h5"), producer);
    // Other heads.
    TransferShape four = shape;
    four.heads = 4;
    writeSide(path("inc_heads.h5"), makeSide(four, 1, 40, 0));
    try {
        compareTransfer(path("inc_p.h5"), path("inc_heads.h5"));
        QFAIL("captures of 2 and 4 heads were compared");
    } catch (const TransferMismatch& e) {
        QVERIFY2(std::string(e.what()).find("differ in KV heads (2 and 4)") != std::string::npos, e.what());
    }
    // No prompt in common.
    Side other = makeSide(shape, 1, 40, 0);
    other.prompts[0].tokens = tokensOf(7, 40);
    writeSide(path("inc_prompts.h5"), other);
    try {
        compareTransfer(path("inc_p.h5"), path("inc_prompts.h5"));
        QFAIL("captures of different prompts were compared");
    } catch (const TransferMismatch& e) {
        const std::string what = e.what();
        QVERIFY2(what.find("no prompt of the consumer") != std::string::npos && what.find("inc_prompts.h5") != std::string::npos &&
                     what.find("different requests") != std::string::npos,
                 e.what());
    }
    // Another block size.
    TransferShape blocks8 = shape;
    blocks8.blockSize = 8;
    writeSide(path("inc_bs.h5"), makeSide(blocks8, 1, 40, 0));
    QVERIFY_THROWS_EXCEPTION(TransferMismatch, compareTransfer(path("inc_p.h5"), path("inc_bs.h5")));
    // Another model.
    TransferShape model = shape;
    model.model = "another";
    writeSide(path("inc_model.h5"), makeSide(model, 1, 40, 0));
    QVERIFY_THROWS_EXCEPTION(TransferMismatch, compareTransfer(path("inc_p.h5"), path("inc_model.h5")));
    // Not a bundle: the file named.
    {
        std::ofstream junk(path("junk.h5"));
        junk << "not hdf5";
    }
    try {
        compareTransfer(path("inc_p.h5"), path("junk.h5"));
        QFAIL("a file that is not a bundle was read");
    } catch (const BundleError& e) {
        QCOMPARE(e.file(), path("junk.h5"));
    }
}

void TestTransferCompare::jsonNamesTheFirstChange()
{
    const TransferShape shape;
    const Side producer = makeSide(shape, 2, 40, 0);
    Side consumer = movedTo(producer, 30);
    for (int part = 0; part < 2; ++part)
        for (int h = 0; h < 2; ++h)
            for (int t = 0; t < 16; ++t)
                std::copy_n(producer.prompts[0].row(shape, 1, part, 2, h, t), 8, consumer.prompts[1].row(shape, 1, part, 1, h, t));
    const TransferResult r = compare("json", producer, consumer);
    std::ostringstream text;
    writeTransferJson(r, text);
    const nlohmann::json j = nlohmann::json::parse(text.str());
    QCOMPARE(j["exit_status"].get<int>(), 1);
    QCOMPARE(j["verdict"].get<std::string>(), std::string("changed"));
    QCOMPARE(j["changed_block_count"].get<int>(), 1);
    const nlohmann::json& first = j["first_change"];
    QCOMPARE(first["layer"].get<std::string>(), layerName(1));
    QCOMPARE(first["prompt"].get<std::string>(), std::string("p1"));
    QCOMPARE(first["position"].get<int>(), 16);
    QCOMPARE(first["head"].get<int>(), 0);
    QCOMPARE(first["part"].get<std::string>(), std::string("k"));
    QCOMPARE(first["block"].get<int>(), 1);
    QCOMPARE(first["producer_block"].get<int>(), 9);
    QCOMPARE(first["consumer_block"].get<int>(), 39);
    const nlohmann::json& b = j["changed_blocks"][0];
    QCOMPARE(b["explanation"].get<std::string>(), std::string("other_request"));
    QCOMPARE(b["hypothesis"]["source"]["prompt"].get<std::string>(), std::string("p0"));
    QCOMPARE(b["hypothesis"]["source"]["block"].get<int>(), 2);
    QVERIFY(b["positions"] == nlohmann::json::parse("[16, 32]"));
    QVERIFY(b["changed_positions"] == nlohmann::json::parse("[[16, 32]]"));
    QCOMPARE(b["whole_block"].get<bool>(), true);
    QVERIFY(j["prompts"][1]["transferred"] == nlohmann::json::parse("[[0, 40]]"));

    std::ostringstream error;
    writeTransferErrorJson("a.h5", "b.h5", "why", error);
    const nlohmann::json e = nlohmann::json::parse(error.str());
    QCOMPARE(e["exit_status"].get<int>(), 2);
    QCOMPARE(e["error"].get<std::string>(), std::string("why"));
}

QTEST_GUILESS_MAIN(TestTransferCompare)
#include "tst_transfer_compare.moc"
