// `kvscope transfer PRODUCER CONSUMER [--json OUT]` run as a user runs it: exit 0 on identical
// captures, 1 with a changed block (named in the output and the JSON), 2 on captures that cannot
// be compared or cannot be read (the JSON says so too, the message names the file), and the
// command in `kvscope --help`.

#include "transfer_pair.h"

#include <QProcess>
#include <QTemporaryDir>
#include <QTest>

#include <nlohmann/json.hpp>

#include <fstream>

using namespace kvtest;

namespace {

struct Run {
    int exitCode = -1;
    QString out, err;
};

Run runKvscope(const QStringList& args)
{
    QProcess process;
    process.start(KVSCOPE_BINARY, args);
    process.waitForFinished(60000);
    return {process.exitStatus() == QProcess::NormalExit ? process.exitCode() : -1,
            QString::fromUtf8(process.readAllStandardOutput()), QString::fromUtf8(process.readAllStandardError())};
}

nlohmann::json readJson(const QString& path)
{
    std::ifstream file(path.toStdString());
    return nlohmann::json::parse(file);
}

}  // namespace

class TestTransferCommand : public QObject {
    Q_OBJECT

private slots:
    void initTestCase();
    void identicalExitsZero();
    void changedBlockExitsOne();
    void incomparableExitsTwo();
    void listedInHelp();

private:
    QString path(const char* name) const { return m_dir.filePath(name); }
    QTemporaryDir m_dir;
};

void TestTransferCommand::initTestCase()
{
    QVERIFY(m_dir.isValid());
    const TransferShape shape;
    const Side producer = makeSide(shape, 2, 40, 0);
    Side consumer = producer;
    for (SidePrompt& p : consumer.prompts)
        for (std::int32_t& id : p.physical)
            id += 30;
    writeSide(path("producer.h5").toStdString(), producer);
    writeSide(path("consumer.h5").toStdString(), consumer);
    // The consumer's block 1 of p1, layer 0, holds its block 2 (an offset of one block).
    for (int part = 0; part < 2; ++part)
        for (int h = 0; h < 2; ++h)
            for (int t = 0; t < 16; ++t)
                std::copy_n(producer.prompts[1].row(shape, 0, part, 2, h, t), 8, consumer.prompts[1].row(shape, 0, part, 1, h, t));
    writeSide(path("shifted.h5").toStdString(), consumer);
    TransferShape four = shape;
    four.heads = 4;
    writeSide(path("four_heads.h5").toStdString(), makeSide(four, 2, 40, 0));
}

void TestTransferCommand::identicalExitsZero()
{
    const Run run = runKvscope({"transfer", path("producer.h5"), path("consumer.h5"), "--json", path("same.json")});
    QCOMPARE(run.exitCode, 0);
    QVERIFY2(run.out.contains("identical"), qPrintable(run.out));
    const nlohmann::json j = readJson(path("same.json"));
    QCOMPARE(j["exit_status"].get<int>(), 0);
    QCOMPARE(j["verdict"].get<std::string>(), std::string("identical"));
    QCOMPARE(j["prompts"].size(), std::size_t(2));
    QVERIFY(j["first_change"].is_null());
    QVERIFY(j["changed_blocks"].empty());
    QCOMPARE(j["compared_positions"].get<int>(), 80);
}

void TestTransferCommand::changedBlockExitsOne()
{
    const Run run = runKvscope({"transfer", path("producer.h5"), path("shifted.h5"), "--json", path("shifted.json")});
    QCOMPARE(run.exitCode, 1);
    QVERIFY2(run.out.contains("block_offset"), qPrintable(run.out));
    QVERIFY2(run.out.contains("first change: model.layers.0.self_attn"), qPrintable(run.out));
    const nlohmann::json j = readJson(path("shifted.json"));
    QCOMPARE(j["exit_status"].get<int>(), 1);
    QCOMPARE(j["changed_block_count"].get<int>(), 1);
    const nlohmann::json& b = j["changed_blocks"][0];
    QCOMPARE(b["prompt"].get<std::string>(), std::string("p1"));
    QCOMPARE(b["layer"].get<std::string>(), std::string("model.layers.0.self_attn"));
    QCOMPARE(b["block"].get<int>(), 1);
    QCOMPARE(b["producer_block"].get<int>(), 9);
    QCOMPARE(b["consumer_block"].get<int>(), 39);
    QCOMPARE(b["explanation"].get<std::string>(), std::string("block_offset"));
    QCOMPARE(b["hypothesis"]["offset_blocks"].get<int>(), 1);
    QCOMPARE(j["first_change"]["position"].get<int>(), 16);
    QCOMPARE(j["explanations"]["block_offset"].get<int>(), 1);
}

void TestTransferCommand::incomparableExitsTwo()
{
    Run run = runKvscope({"transfer", path("producer.h5"), path("four_heads.h5"), "--json", path("heads.json")});
    QCOMPARE(run.exitCode, 2);
    QVERIFY2(run.err.contains("differ in KV heads (2 and 4)"), qPrintable(run.err));
    const nlohmann::json j = readJson(path("heads.json"));
    QCOMPARE(j["exit_status"].get<int>(), 2);
    QCOMPARE(j["verdict"].get<std::string>(), std::string("incomparable"));
    QVERIFY(j["error"].get<std::string>().find("four_heads.h5") != std::string::npos);

    run = runKvscope({"transfer", path("producer.h5"), path("missing.h5")});
    QCOMPARE(run.exitCode, 2);
    QVERIFY2(run.err.contains("missing.h5"), qPrintable(run.err));

    run = runKvscope({"transfer", path("producer.h5")});  // a bad command line: its usage
    QCOMPARE(run.exitCode, 2);
    QVERIFY2(run.err.contains("transfer PRODUCER CONSUMER"), qPrintable(run.err));
}

void TestTransferCommand::listedInHelp()
{
    const Run run = runKvscope({"--help"});
    QCOMPARE(run.exitCode, 0);
    QVERIFY2(run.out.contains("transfer"), qPrintable(run.out));
}

QTEST_GUILESS_MAIN(TestTransferCommand)
#include "tst_transfer_command.moc"
