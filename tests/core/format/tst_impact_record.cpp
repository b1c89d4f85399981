// The impact record (format/impact_record.h, docs/bundle-format.md "Impact"): written into a
// valid bundle and read back through BundleReader bit for bit, and every malformed record refused
// with a BundleError naming the file, the object (prompts/<id>/impact...) and the problem.

#include "format/bundle_reader.h"
#include "format/impact_record.h"
#include "synth/model_capture.h"
#include "test_support.h"

#include <QFile>
#include <QTemporaryDir>
#include <QTest>

#include <cmath>
#include <cstring>
#include <limits>

using namespace kvscope;
using namespace kvtest;

namespace {

// A small valid bundle without impact: 2 layers, one prompt of 8 tokens, 4 decode steps.
void writeSmallCapture(const std::string& path)
{
    synth::ModelCaptureOptions o;
    o.shape.layers = 2;
    o.shape.hidden = 32;
    o.shape.ffn = 64;
    o.shape.vocab = 64;
    o.shape.window = 4;
    o.promptLens = {8};
    o.decodeTokens = 4;
    o.baseline = false;
    o.impact = false;
    o.threads = 1;
    synth::writeModelCapture(path, o);
}

// A record over the capture's two layers: every kind once, 4 steps, KL values whose bits must
// survive (a subnormal, 0, large values).
ImpactRecord sampleRecord(const std::vector<std::string>& layers)
{
    ImpactRecord r;
    r.computedBy = "a test";
    r.seconds = 1.25;
    r.transplants = {{TransplantKind::Layer, layers[0], {}},
                     {TransplantKind::From, layers[0], {}},
                     {TransplantKind::Scheme, layers[1], "fp8_e4m3/tensor"},
                     {TransplantKind::Baseline, layers[1], {}},
                     {TransplantKind::BaselineFrom, layers[1], {}}};
    r.steps = 4;
    for (std::size_t t = 0; t < r.transplants.size(); ++t)
        for (int g = 0; g < 4; ++g) {
            r.kl.push_back(t == 0 && g == 0 ? std::numeric_limits<double>::denorm_min()
                           : g == 1         ? 0.0
                                            : std::ldexp(1.0 + 0.1 * double(t), int(g) * 7 - 20) / 3.0);
            r.top1Changed.push_back(std::int8_t((t + std::size_t(g)) % 2));
        }
    return r;
}

}  // namespace

class TestImpactRecord : public QObject {
    Q_OBJECT

private slots:
    void initTestCase();
    void roundTrip();
    void withoutImpact();
    void transplantRows_data();
    void transplantRows();
    void refusals_data();
    void refusals();
    void refusedShapesAndTypes_data();
    void refusedShapesAndTypes();

private:
    QTemporaryDir m_dir;
    std::string m_clean;  // the capture without impact, copied for each case
    std::string m_prompt;
    std::vector<std::string> m_layers;
    std::string fresh(const QString& name);
};

void TestImpactRecord::initTestCase()
{
    QVERIFY(m_dir.isValid());
    m_clean = m_dir.filePath("clean.h5").toStdString();
    writeSmallCapture(m_clean);
    const BundleReader reader(m_clean);
    QCOMPARE(reader.prompts().size(), std::size_t(1));
    m_prompt = reader.prompts()[0].id;
    m_layers = reader.config().layerNames();
    QCOMPARE(m_layers.size(), std::size_t(2));
}

std::string TestImpactRecord::fresh(const QString& name)
{
    const QString path = m_dir.filePath(name);
    QFile::remove(path);
    if (!QFile::copy(QString::fromStdString(m_clean), path))
        qFatal("cannot copy the capture");
    return path.toStdString();
}

void TestImpactRecord::roundTrip()
{
    const std::string path = fresh("round_trip.h5");
    ImpactRecord written = sampleRecord(m_layers);
    {
        // A first record replaced by the second: only the second is read.
        Hdf5File file = Hdf5File::openForUpdate(path);
        ImpactRecord first = written;
        first.transplants.resize(1);
        first.kl.resize(4);
        first.top1Changed.resize(4);
        first.computedBy = "replaced";
        writeImpact(file, m_prompt, first);
        writeImpact(file, m_prompt, written);
    }
    std::optional<ImpactRecord> read;
    {
        const BundleReader reader(path);
        QVERIFY(reader.prompt(m_prompt).hasImpact);
        read = reader.readImpact(m_prompt);
    }
    QVERIFY(read.has_value());
    QCOMPARE(read->computedBy, written.computedBy);
    QCOMPARE(read->seconds, 1.25);
    QVERIFY(read->transplants == written.transplants);
    QCOMPARE(read->steps, std::int64_t(4));
    QCOMPARE(read->kl.size(), written.kl.size());
    for (std::size_t i = 0; i < written.kl.size(); ++i)
        QVERIFY2(std::memcmp(&read->kl[i], &written.kl[i], sizeof(double)) == 0, qPrintable(QString::number(i)));
    QVERIFY(read->top1Changed == written.top1Changed);
    // Row lookup and the [transplant, step] indexing.
    QCOMPARE(read->find({TransplantKind::Scheme, m_layers[1], "fp8_e4m3/tensor"}), std::optional<std::size_t>(2));
    QCOMPARE(read->find({TransplantKind::Scheme, m_layers[1], "int8/tensor"}), std::optional<std::size_t>());
    QCOMPARE(read->klAt(3, 2), std::ldexp(1.3, 14 - 20) / 3.0);
    QCOMPARE(read->changedAt(3, 2), true);   // (3 + 2) % 2
    QCOMPARE(read->changedAt(3, 1), false);

    // Without `seconds` it reads as not recorded.
    {
        Hdf5File file = Hdf5File::openForUpdate(path);
        written.seconds = -1;
        writeImpact(file, m_prompt, written);
    }
    QCOMPARE(BundleReader(path).readImpact(m_prompt)->seconds, -1.0);
}

void TestImpactRecord::withoutImpact()
{
    const BundleReader reader(m_clean);
    QVERIFY(!reader.prompt(m_prompt).hasImpact);
    QVERIFY(!reader.readImpact(m_prompt).has_value());
}

void TestImpactRecord::transplantRows_data()
{
    QTest::addColumn<QString>("json");
    QTest::addColumn<QString>("problem");  // empty: accepted
    QTest::newRow("layer") << R"({"kind": "layer", "layer": "L"})" << "";
    QTest::newRow("from") << R"({"kind": "from", "layer": "L"})" << "";
    QTest::newRow("scheme") << R"({"kind": "scheme", "layer": "L", "scheme": "int8/head"})" << "";
    QTest::newRow("baseline") << R"({"kind": "baseline", "layer": "L"})" << "";
    QTest::newRow("baseline_from") << R"({"kind": "baseline_from", "layer": "L"})" << "";
    QTest::newRow("not JSON") << "{kind" << "is not a JSON object";
    QTest::newRow("array") << R"(["layer", "L"])" << "is not a JSON object";
    QTest::newRow("no kind") << R"({"layer": "L"})" << "has no string \"kind\"";
    QTest::newRow("kind a number") << R"({"kind": 1, "layer": "L"})" << "has no string \"kind\"";
    QTest::newRow("no layer") << R"({"kind": "layer"})" << "has no string \"layer\"";
    QTest::newRow("empty layer") << R"({"kind": "layer", "layer": ""})" << "has no string \"layer\"";
    QTest::newRow("unknown kind") << R"({"kind": "swap", "layer": "L"})" << "unknown kind 'swap'";
    QTest::newRow("scheme without scheme") << R"({"kind": "scheme", "layer": "L"})" << "without a string \"scheme\"";
    QTest::newRow("unknown key") << R"({"kind": "layer", "layer": "L", "head": 3})" << "unknown key 'head'";
}

void TestImpactRecord::transplantRows()
{
    QFETCH(QString, json);
    QFETCH(QString, problem);
    Transplant t;
    const std::string got = parseTransplant(json.toStdString(), t);
    if (problem.isEmpty()) {
        QVERIFY2(got.empty(), got.c_str());
        QCOMPARE(t.layer, std::string("L"));
        // And back: the same row.
        Transplant again;
        QVERIFY(parseTransplant(transplantJson(t), again).empty());
        QVERIFY(again == t);
    } else {
        QVERIFY2(got.find(problem.toStdString()) != std::string::npos, got.c_str());
    }
}

void TestImpactRecord::refusals_data()
{
    // A record written as is by writeImpact (which does not check), refused on read.
    QTest::addColumn<int>("change");
    QTest::addColumn<QString>("problem");
    QTest::newRow("negative KL") << 0 << "transplant 1 ({\"kind\":\"from\",\"layer\":\"model.layers.0.self_attn\"}), step 2: KL -0.001";
    QTest::newRow("NaN KL") << 1 << "step 3: KL nan (a KL divergence is finite and never negative)";
    QTest::newRow("infinite KL") << 2 << "KL inf";
    QTest::newRow("top1 flag 2") << 3 << "step 0: top1_changed 2 (0 or 1)";
    QTest::newRow("top1 flag -1") << 4 << "top1_changed -1 (0 or 1)";
    QTest::newRow("layer not in the config") << 5 << "layer 'model.layers.7.self_attn' is not in the KV cache config";
    QTest::newRow("a row listed twice") << 6 << "transplant 2 ({\"kind\":\"layer\",\"layer\":\"model.layers.0.self_attn\"}): listed twice";
    QTest::newRow("no step") << 7 << "no decode step";
}

void TestImpactRecord::refusals()
{
    QFETCH(int, change);
    QFETCH(QString, problem);
    QCOMPARE(m_layers[0], std::string("model.layers.0.self_attn"));
    const std::string path = fresh("refused.h5");
    ImpactRecord r = sampleRecord(m_layers);
    const std::size_t steps = 4;
    switch (change) {
    case 0: r.kl[1 * steps + 2] = -1e-3; break;
    case 1: r.kl[0 * steps + 3] = std::nan(""); break;
    case 2: r.kl[4 * steps + 1] = INFINITY; break;
    case 3: r.top1Changed[2 * steps + 0] = 2; break;
    case 4: r.top1Changed[3 * steps + 1] = -1; break;
    case 5: r.transplants[3].layer = "model.layers.7.self_attn"; break;
    case 6: r.transplants[2] = r.transplants[0]; break;
    case 7:
        r.steps = 0;
        r.kl.clear();
        r.top1Changed.clear();
        break;
    }
    {
        Hdf5File file = Hdf5File::openForUpdate(path);
        writeImpact(file, m_prompt, r);
    }
    const BundleReader reader(path);
    QVERIFY(reader.prompt(m_prompt).hasImpact);
    expectBundleError([&] { reader.readImpact(m_prompt); },
                      {path, "prompts/" + m_prompt + "/impact", problem.toStdString()});
    // The check alone says the same.
    QVERIFY(impactRecordProblem(r, m_layers).find(problem.toStdString()) != std::string::npos);
}

void TestImpactRecord::refusedShapesAndTypes_data()
{
    // A valid record with one dataset written over by hand.
    QTest::addColumn<int>("change");
    QTest::addColumn<QString>("object");
    QTest::addColumn<QString>("problem");
    QTest::newRow("top1_changed of another shape") << 0 << "/impact/top1_changed" << "must have kl's shape";
    QTest::newRow("fewer kl rows than transplants") << 1 << "/impact/kl" << "must be [transplants, steps] with 5 transplants";
    QTest::newRow("kl of one dimension") << 2 << "/impact/kl" << "must be [transplants, steps] with 5 transplants";
    QTest::newRow("float32 kl") << 3 << "/impact/kl" << "must hold float64 values";
    QTest::newRow("float top1_changed") << 4 << "/impact/top1_changed" << "must hold integers";
    QTest::newRow("an unknown kind") << 5 << "/impact/transplants" << "row 1 has an unknown kind 'swap'";
    QTest::newRow("a row not JSON") << 6 << "/impact/transplants" << "row 0 is not a JSON object";
    QTest::newRow("no kl") << 7 << "/impact/kl" << "";
}

void TestImpactRecord::refusedShapesAndTypes()
{
    QFETCH(int, change);
    QFETCH(QString, object);
    QFETCH(QString, problem);
    const std::string path = fresh("refused_shape.h5");
    const std::string impact = impactPath(m_prompt);
    const ImpactRecord r = sampleRecord(m_layers);
    {
        Hdf5File file = Hdf5File::openForUpdate(path);
        writeImpact(file, m_prompt, r);
        const std::vector<double> wide(5 * 5, 0.0), narrow(4 * 4, 0.0);
        const std::vector<float> singles(5 * 4, 0.0f);
        const std::vector<std::int8_t> flags(5 * 5, 0);
        switch (change) {
        case 0:
            file.remove(impact + "/top1_changed");
            file.writeRaw(impact + "/top1_changed", H5T_STD_I8LE, {5, 5}, flags.data());
            break;
        case 1:
            file.remove(impact + "/kl");
            file.writeRaw(impact + "/kl", H5T_IEEE_F64LE, {4, 4}, narrow.data());
            break;
        case 2:
            file.remove(impact + "/kl");
            file.writeRaw(impact + "/kl", H5T_IEEE_F64LE, {20}, wide.data());
            break;
        case 3:
            file.remove(impact + "/kl");
            file.writeRaw(impact + "/kl", H5T_IEEE_F32LE, {5, 4}, singles.data());
            break;
        case 4:
            file.remove(impact + "/top1_changed");
            file.writeRaw(impact + "/top1_changed", H5T_IEEE_F32LE, {5, 4}, singles.data());
            break;
        case 5:
        case 6: {
            std::vector<std::string> rows;
            for (const Transplant& t : r.transplants)
                rows.push_back(transplantJson(t));
            if (change == 5)
                rows[1] = R"({"kind": "swap", "layer": "model.layers.0.self_attn"})";
            else
                rows[0] = "layer 0";
            file.remove(impact + "/transplants");
            file.writeStrings(impact + "/transplants", rows);
            break;
        }
        case 7: file.remove(impact + "/kl"); break;
        }
    }
    const BundleReader reader(path);
    std::vector<std::string> parts{path, "prompts/" + m_prompt + object.toStdString()};
    if (!problem.isEmpty())
        parts.push_back(problem.toStdString());
    expectBundleError([&] { reader.readImpact(m_prompt); }, parts);
}

QTEST_GUILESS_MAIN(TestImpactRecord)
#include "tst_impact_record.moc"
