// The one JSON writer: strict output whatever the data (NaN and infinities as null, text that
// is not UTF-8 escaped), numbers in their shortest exact form, commas and nesting right; and
// the documents written with it (check's verdict, a nlohmann document) parse strictly.

#include "analysis/threshold_check.h"
#include "util/json_writer.h"

#include <nlohmann/json.hpp>

#include <QTest>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <sstream>

using namespace kvscope;

class TestJsonWriter : public QObject {
    Q_OBJECT

private slots:
    void nestingAndCommas();
    void nonFiniteNumbersAreNull();
    void numbersAreShortestAndExact();
    void longRowsOfFloatsReadBackExactly_data();
    void longRowsOfFloatsReadBackExactly();
    void emptyRows();
    void blocksOfRows_data();
    void blocksOfRows();
    void integersAtTheirLimits();
    void textIsEscapedAndAlwaysValid();
    void nlohmannDocumentsFollowTheSameRules();
    void verdictParsesStrictlyWithNonFiniteValues();
};

namespace {

// Strict: nlohmann rejects NaN, Infinity and invalid UTF-8.
nlohmann::json parseStrict(const std::string& text)
{
    return nlohmann::json::parse(text);
}

}  // namespace

void TestJsonWriter::nestingAndCommas()
{
    std::ostringstream out;
    JsonWriter w(out);
    const float three[] = {1.5f, -2.0f, 0.25f};
    w.beginObject()
        .field("a", 1)
        .key("b")
        .beginArray()
        .value(true)
        .null()
        .beginObject()
        .endObject()
        .beginArray()
        .endArray()
        .endArray()
        .key("c")
        .floats(three, 3)
        .key("d")
        .floats(three, 0)
        .key("e")
        .strings({"x", "y"})
        .key("f")
        .numbers(std::vector<int>{3, 4})
        .field("g", std::optional<int>())
        .field("h", std::optional<double>(0.5))
        .endObject();
    QCOMPARE(out.str(), std::string(R"({"a":1,"b":[true,null,{},[]],"c":[1.5,-2,0.25],"d":[],"e":["x","y"],"f":[3,4],"g":null,"h":0.5})"));
    QVERIFY(parseStrict(out.str()).is_object());
}

void TestJsonWriter::nonFiniteNumbersAreNull()
{
    const float nanF = std::nanf(""), infF = std::numeric_limits<float>::infinity();
    const double nanD = std::nan(""), infD = std::numeric_limits<double>::infinity();
    const float row[] = {nanF, infF, -infF, 1.0f};
    std::ostringstream out;
    JsonWriter w(out);
    w.beginArray().value(nanF).value(infF).value(-infD).value(nanD).floats(row, 4).value(std::optional<double>(infD)).endArray();
    QCOMPARE(out.str(), std::string("[null,null,null,null,[null,null,null,1],null]"));
    QVERIFY(parseStrict(out.str()).is_array());
}

void TestJsonWriter::numbersAreShortestAndExact()
{
    std::ostringstream out;
    JsonWriter(out).beginArray().value(0.1f).value(0.1).value(1e-7f).value(3.0f).value(-0.0f).endArray();
    // 0.1f is 0.100000001490116...: its shortest form that reads back as the same float is 0.1.
    QCOMPARE(out.str(), std::string("[0.1,0.1,1e-07,3,-0]"));

    std::mt19937 random(7);
    std::uniform_int_distribution<std::uint32_t> bits;
    std::vector<float> values;
    while (values.size() < 20000) {
        const std::uint32_t b = bits(random);
        float v;
        std::memcpy(&v, &b, sizeof v);
        if (std::isfinite(v))
            values.push_back(v);
    }
    std::ostringstream many;
    JsonWriter(many).floats(values.data(), values.size());
    const nlohmann::json parsed = parseStrict(many.str());
    for (std::size_t i = 0; i < values.size(); ++i)
        QCOMPARE(float(parsed[i].get<double>()), values[i]);  // every float read back exactly
}

void TestJsonWriter::longRowsOfFloatsReadBackExactly_data()
{
    QTest::addColumn<int>("rows");
    QTest::addColumn<int>("width");
    QTest::newRow("rows longer than the writer's buffer") << 3 << 7001;
    // Past 2^15 numbers, formatted in parts by several threads (parts end mid-row), and past
    // 2^20, a block at a time.
    QTest::newRow("many short rows, in parts") << 50001 << 8;
    QTest::newRow("rows across blocks") << 350003 << 3;
}

void TestJsonWriter::longRowsOfFloatsReadBackExactly()
{
    // With NaN and infinities among them: parsed back, every number is the float written (bit
    // for bit) and every non-finite one null, in rows of the width written.
    QFETCH(int, rows);
    QFETCH(int, width);
    const std::size_t w = std::size_t(width);
    std::vector<float> values(std::size_t(rows) * w);
    std::uint32_t state = 7;
    for (std::size_t i = 0; i < values.size(); ++i) {
        state = state * 1664525u + 1013904223u;
        std::uint32_t bits = state;
        std::memcpy(&values[i], &bits, sizeof bits);  // any float, subnormals and extremes included
        if (i % 97 == 0)
            values[i] = std::nanf("");
        if (i % 101 == 0)
            values[i] = -std::numeric_limits<float>::infinity();
    }
    std::ostringstream out;
    JsonWriter writer(out);
    writer.beginObject().key("rows").floatRows(values.data(), std::size_t(rows), w).key("flat").floats(values.data(), values.size()).endObject();
    const nlohmann::json doc = parseStrict(out.str());
    QCOMPARE(doc["rows"].size(), std::size_t(rows));
    QCOMPARE(doc["flat"].size(), values.size());
    for (std::size_t i = 0; i < values.size(); ++i) {
        const nlohmann::json& row = doc["rows"][i / w];
        if (i % w == 0)
            QCOMPARE(row.size(), w);
        const nlohmann::json& fromRows = row[i % w];
        const nlohmann::json& fromFlat = doc["flat"][i];
        for (const nlohmann::json* v : {&fromRows, &fromFlat}) {
            if (!std::isfinite(values[i])) {
                QVERIFY2(v->is_null(), qPrintable(QString::number(i)));
                continue;
            }
            const float back = v->get<float>();
            QVERIFY2(std::memcmp(&back, &values[i], sizeof back) == 0 || (back == 0 && values[i] == 0),
                     qPrintable(QString::number(i)));
        }
    }
}

void TestJsonWriter::emptyRows()
{
    const float one = 1.0f;
    std::ostringstream out;
    JsonWriter(out).beginArray().floatRows(&one, 0, 5).floatRows(&one, 2, 0).floats(&one, 0).floatRow(&one, 1).endArray();
    QCOMPARE(out.str(), std::string("[[],[[],[]],[],[1]]"));
}

void TestJsonWriter::blocksOfRows_data()
{
    QTest::addColumn<int>("blocks");
    QTest::addColumn<int>("rows");
    QTest::addColumn<int>("width");
    QTest::newRow("small") << 2 << 3 << 4;
    QTest::newRow("a layer's metric, in parts") << 5 << 2048 << 8;
    QTest::newRow("across pieces") << 3 << 70001 << 5;
    QTest::newRow("empty blocks") << 2 << 0 << 4;
    QTest::newRow("rows of nothing") << 2 << 3 << 0;
}

// [block][row][column] as written reads back as the same numbers in the same places, and every
// value is reported written once, in order.
void TestJsonWriter::blocksOfRows()
{
    QFETCH(int, blocks);
    QFETCH(int, rows);
    QFETCH(int, width);
    const std::size_t b = std::size_t(blocks), r = std::size_t(rows), w = std::size_t(width);
    std::vector<float> values(b * r * w);
    for (std::size_t i = 0; i < values.size(); ++i)
        values[i] = i % 89 == 0 ? std::nanf("") : float(i) * 0.25f - 7.0f;
    std::ostringstream out;
    std::size_t reported = 0;
    JsonWriter writer(out);
    writer.beginArray().value(1).floatBlocks(values.data(), b, r, w, [&](std::size_t first, std::size_t count) {
        QCOMPARE(first, reported);
        reported += count;
    });
    writer.value(2).endArray();
    if (!values.empty())
        QCOMPARE(reported, values.size());
    const nlohmann::json doc = parseStrict(out.str());
    QCOMPARE(doc.size(), std::size_t(3));
    QCOMPARE(doc[0].get<int>(), 1);
    QCOMPARE(doc[2].get<int>(), 2);
    const nlohmann::json& grid = doc[1];
    QCOMPARE(grid.size(), b);
    for (std::size_t i = 0; i < b; ++i) {
        QCOMPARE(grid[i].size(), r);
        for (std::size_t j = 0; j < r; ++j) {
            QCOMPARE(grid[i][j].size(), w);
            for (std::size_t k = 0; k < w; ++k) {
                const float v = values[(i * r + j) * w + k];
                const nlohmann::json& x = grid[i][j][k];
                if (std::isnan(v))
                    QVERIFY(x.is_null());
                else
                    QCOMPARE(x.get<float>(), v);
            }
        }
    }
}

void TestJsonWriter::integersAtTheirLimits()
{
    std::ostringstream out;
    JsonWriter(out)
        .beginArray()
        .value(std::numeric_limits<std::int64_t>::min())
        .value(std::numeric_limits<std::int64_t>::max())
        .value(std::numeric_limits<std::uint64_t>::max())
        .value(-1)
        .endArray();
    QCOMPARE(out.str(), std::string("[-9223372036854775808,9223372036854775807,18446744073709551615,-1]"));
}

void TestJsonWriter::textIsEscapedAndAlwaysValid()
{
    QCOMPARE(jsonString("a\"b\\c\n\x01"), std::string("\"a\\\"b\\\\c\\n\\u0001\""));
    // Valid UTF-8 is kept; bytes that are not (names come from files) become the text \xNN,
    // so that the JSON stays valid: a stray continuation byte, a cut sequence, an overlong
    // form, a surrogate, a code point beyond U+10FFFF.
    QCOMPARE(jsonString("é中😀"), std::string("\"é中😀\""));
    QCOMPARE(jsonString("a\x80"), std::string("\"a\\\\x80\""));
    QCOMPARE(jsonString("\xe4\xb8"), std::string("\"\\\\xe4\\\\xb8\""));
    QCOMPARE(jsonString("\xe0\x80\xaf"), std::string("\"\\\\xe0\\\\x80\\\\xaf\""));
    QCOMPARE(jsonString("\xed\xa0\x80"), std::string("\"\\\\xed\\\\xa0\\\\x80\""));
    QCOMPARE(jsonString("\xf4\x90\x80\x80"), std::string("\"\\\\xf4\\\\x90\\\\x80\\\\x80\""));
    for (const char* text : {"a\x80", "\xed\xa0\x80", "\xf4\x90\x80\x80", "\xc0\xaf"})
        QVERIFY(parseStrict(jsonString(text)).is_string());
    // Keys follow the same rules.
    std::ostringstream out;
    JsonWriter(out).beginObject().field("k\x80\"", "v").endObject();
    QCOMPARE(out.str(), std::string("{\"k\\\\x80\\\"\":\"v\"}"));
    QVERIFY(parseStrict(out.str()).contains("k\\x80\""));
}

void TestJsonWriter::nlohmannDocumentsFollowTheSameRules()
{
    nlohmann::json document = {{"layers", 80},           {"ratio", 0.1},       {"missing", std::nan("")},
                               {"names", {"a", "b\x80"}}, {"flag", false},      {"none", nullptr},
                               {"big", std::uint64_t(1) << 63}, {"nested", {{"inf", HUGE_VAL}}}};
    const std::string text = jsonText(document);
    // nlohmann's own dump would throw on "b\x80" and write the double 0.1 the same; here the
    // keys come in nlohmann's (sorted) order.
    QCOMPARE(text, std::string(R"({"big":9223372036854775808,"flag":false,"layers":80,"missing":null,"names":["a","b\\x80"],"nested":{"inf":null},"none":null,"ratio":0.1})"));
    QVERIFY(parseStrict(text).is_object());
}

void TestJsonWriter::verdictParsesStrictlyWithNonFiniteValues()
{
    Thresholds t;
    t.maxLinf = std::numeric_limits<double>::infinity();
    t.maxRatio = std::nan("");
    std::vector<Violation> violations(2);
    violations[0] = {"p\x80", "layers.0", 5, 1, "k_linf", std::nan(""), 0.05, "evidence \"quoted\""};
    violations[1] = {"", "layers.1", -1, -1, "combined k_bc", -std::numeric_limits<double>::infinity(), 0.9, ""};
    std::ostringstream out;
    writeVerdictJson("b.h5", t, violations, out);
    const nlohmann::json j = parseStrict(out.str());
    QCOMPARE(j["passed"].get<bool>(), false);
    QVERIFY(j["thresholds"]["max_linf"].is_null());
    QVERIFY(j["thresholds"]["max_ratio"].is_null());
    QCOMPARE(j["thresholds"]["min_bc"].get<double>(), 0.9);
    QVERIFY(j["violations"][0]["value"].is_null());
    QCOMPARE(j["violations"][0]["prompt"].get<std::string>(), std::string("p\\x80"));
    QCOMPARE(j["violations"][0]["token"].get<int>(), 5);
    QCOMPARE(j["violations"][0]["evidence"].get<std::string>(), std::string("evidence \"quoted\""));
    QVERIFY(j["violations"][1]["prompt"].is_null());
    QVERIFY(j["violations"][1]["token"].is_null());
    QVERIFY(j["violations"][1]["head"].is_null());
    QVERIFY(!j["violations"][1].contains("evidence"));
}

QTEST_APPLESS_MAIN(TestJsonWriter)
#include "tst_json_writer.moc"
