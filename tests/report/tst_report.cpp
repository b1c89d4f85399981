// Reports and the CI check: the HTML opens offline in a real browser (headless Chromium,
// networking off) with every map drawn and no console error; the PNG images carry the
// markers; `kvscope check` exits 0 / 1 / 2 on a clean capture, a faulty one and a broken file.

#include "analysis/analyzer.h"
#include "analysis/state_rows.h"
#include "format/bundle_reader.h"
#include "kv/capture_loader.h"
#include "kv/sweep.h"
#include "synth/model_capture.h"
#include "report/report_writer.h"
#include "diff/diff_side.h"
#include "metric_reference.h"
#include "small_model.h"
#include "synth/synthetic_capture.h"
#include "quant/whatif.h"

#include <QDir>
#include <QFile>
#include <QFileInfo>
#include <QImage>
#include <QCryptographicHash>
#include <QDateTime>
#include <QFileInfo>
#include <QProcess>
#include <QProcessEnvironment>
#include <QRegularExpression>
#include <QTemporaryDir>
#include <QTest>

#include <hdf5.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <limits>

using namespace kvscope;

class TestReport : public QObject {
    Q_OBJECT

private slots:
    void initTestCase();
    void htmlIsSelfContained();
    void embeddedDataIsStrictJsonWithNonFiniteValues();
    void pngsCarryTheMarkers();
    void chromiumDrawsEveryMapOffline();
    void checkExitCodes();
    void reportAndCheckAgree();
    void bundleIsNeverModified();
    void againstComparesWithA();
    void sweepReportNamesMapsByBundle();
    void hybridReportHasTheRecurrentState();
    void impactInTheSuspectsAndPerLayer();
    void whatIfByOutput();

private:
    QTemporaryDir m_dir;
    QString m_bundle;
    std::shared_ptr<BundleReader> m_reader;
    AnalysisResult m_result;
    ReportFiles m_files;
};

void TestReport::initTestCase()
{
    m_bundle = m_dir.filePath("capture.h5");
    writeSyntheticCapture(m_bundle.toStdString(), demoCaptureOptions());
    m_reader = std::make_shared<BundleReader>(m_bundle.toStdString());
    m_result = analyzeBundle(m_reader);
    m_files = writeReport(CaptureLoader(m_reader), m_result, Thresholds{}, m_dir.filePath("report"));
}

void TestReport::htmlIsSelfContained()
{
    QFile f(m_files.html);
    QVERIFY(f.open(QIODevice::ReadOnly));
    const QString html = QString::fromUtf8(f.readAll());
    // Nothing is fetched: no remote URL, no external script or stylesheet.
    QVERIFY(!html.contains("http://") && !html.contains("https://"));
    QVERIFY(!html.contains(QRegularExpression("<script[^>]+src=")));
    QVERIFY(!html.contains(QRegularExpression("<link[^>]+stylesheet")));
    // Two prompts x (ratio, BC, L-inf, L2) x (K, V), and the aggregated BC (vs noise, the
    // reference tool's) for K and V. No per-token BC vs noise: a token has 4 heads x 32 = 128
    // values, too few for one to mean anything (as the app and analyze say).
    QCOMPARE(m_files.images.size(), 2 * 8 + 4);
    for (const QString id : {"prompt_0_k_ratio", "prompt_1_v_bc", "prompt_0_k_linf", "prompt_1_v_l2", "aggregate_k_bc",
                              "aggregate_v_bc_vs_noise"})
        QVERIFY2(html.contains("id=\"map-" + id + "\"") && html.contains("\"id\":\"" + id + "\""), qPrintable(id));
    QVERIFY(!html.contains("id=\"map-prompt_0_k_bc_vs_noise\""));
    // The suspect's onset framed, in the script's data as in the image (this capture has no
    // model behind it: nothing spreads downstream).
    QVERIFY2(html.contains("\"onsetRow\":5,\"spreadRows\":[]"), "the onset row");
    QVERIFY(html.contains("model.layers.5.self_attn"));  // layer names on the axes and in the tables
    QVERIFY(html.contains("FAIL"));                       // the injected fault fails the thresholds
    QVERIFY(html.indexOf("<h2>Suspects</h2>") < html.indexOf("<h2>Capture</h2>"));  // it opens with them
    QVERIFY(html.contains("<th>pattern</th>") && html.contains("model.layers.5.self_attn</td>"));
    // The demo's fault (one head's K rotated one position too far) is explained as such.
    QVERIFY2(html.contains("<th>explanation (residual, floors)</th>") && html.contains("<td>rope_offset ("),
             "the suspect's explanation");
    QVERIFY(!html.contains("NaN"));                       // no data is null, never NaN
}

void TestReport::embeddedDataIsStrictJsonWithNonFiniteValues()
{
    AnalysisResult result = analyzeBundle(m_reader);
    // Infinities and NaN where a map's values and its colour range come from.
    PromptAnalysis& p = result.prompts.front();
    for (auto& metric : p.metrics)
        for (std::size_t i = 0; i < metric.size(); i += 3)
            metric[i] = i % 2 ? std::numeric_limits<float>::infinity() : std::nanf("");
    p.bcVsNoise[0][0] = -std::numeric_limits<float>::infinity();
    const ReportFiles files = writeReport(CaptureLoader(m_reader), result, Thresholds{}, m_dir.filePath("report-nonfinite"));
    QFile f(files.html);
    QVERIFY(f.open(QIODevice::ReadOnly));
    const std::string html = f.readAll().toStdString();
    const std::string open = "id=\"kvscope-data\">";
    const std::size_t begin = html.find(open) + open.size(), end = html.find("</script>", begin);
    QVERIFY(begin > open.size() && end != std::string::npos);
    std::string data = html.substr(begin, end - begin);
    for (std::size_t at; (at = data.find("<\\/")) != std::string::npos;)
        data.replace(at, 3, "</");
    nlohmann::json j;
    try {
        j = nlohmann::json::parse(data);  // strict: no NaN, no Infinity
    } catch (const std::exception& e) {
        QFAIL(e.what());
    }
    int nulls = 0;
    for (const nlohmann::json& map : j["maps"]) {
        QVERIFY(map["scale"]["min"].is_number() || map["scale"]["min"].is_null());
        for (const nlohmann::json& v : map["values"])
            nulls += v.is_null();
    }
    QVERIFY(nulls > 0);
}

void TestReport::pngsCarryTheMarkers()
{
    const QImage image(m_dir.filePath("report/prompt_0_k_linf.png"));
    QVERIFY(!image.isNull());
    QCOMPARE(image.width(), 1400);
    // Find the violet divergence line by scanning one row, then the black prefill/decode line
    // left of it (the first black going left: the axis line is further out).
    const int y = image.height() / 2;
    int black = -1, violet = -1;
    for (int x = 0; x < image.width() && violet < 0; ++x)
        for (int dy = -8; dy <= 8 && violet < 0; ++dy) {
            const QColor d(image.pixel(x, y + dy));
            if (d.red() > 140 && d.red() < 220 && d.green() < 50 && d.blue() > 180)
                violet = x;
        }
    for (int x = violet - 1; x > 0 && black < 0; --x) {
        const QColor c(image.pixel(x, y));
        if (c.red() < 40 && c.green() < 40 && c.blue() < 40)
            black = x;
    }
    QVERIFY2(black > 0 && violet > black, qPrintable(QString("black %1 violet %2").arg(black).arg(violet)));
    // prompt_len 40, divergence 49 over 60 tokens: the lines are 9 tokens apart, in proportion.
    const double tokensApart = double(violet - black) / (image.width() * 0.8 / 60);
    QVERIFY2(tokensApart > 6 && tokensApart < 12, qPrintable(QString::number(tokensApart)));
}

void TestReport::chromiumDrawsEveryMapOffline()
{
    if (!QFileInfo::exists("/usr/bin/chromium"))
        QSKIP("chromium is not installed (packaging/setup-debian.sh installs it)");
    const QString profile = m_dir.filePath("chromium-profile");
    const QStringList common{"--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                             "--disable-background-networking", "--disable-component-update", "--disable-sync",
                             "--user-data-dir=" + profile, "--virtual-time-budget=5000", "--window-size=1400,1600",
                             "--enable-logging=stderr", "--v=0",
                             // networking off: any request would fail, and show as a console error
                             "--proxy-server=127.0.0.1:9", "--proxy-bypass-list=<-loopback>"};
    QProcess dom;
    dom.start("/usr/bin/chromium", common + QStringList{"--dump-dom", "file://" + m_files.html});
    QVERIFY(dom.waitForFinished(120000));
    const QString out = dom.readAllStandardOutput(), err = dom.readAllStandardError();
    QVERIFY2(out.contains("data-maps-drawn=\"20\""), qPrintable(err.right(2000)));
    QVERIFY2(!err.contains("Uncaught") && !err.contains("ERR_"), qPrintable(err.right(2000)));

    const QString shot = m_dir.filePath("shot.png");
    QProcess screenshot;
    screenshot.start("/usr/bin/chromium", common + QStringList{"--screenshot=" + shot, "file://" + m_files.html});
    QVERIFY(screenshot.waitForFinished(120000));
    const QImage image(shot);
    QVERIFY(!image.isNull());
    // The first map is in view: plenty of heatmap colours (not white, not grey text).
    int coloured = 0;
    for (int y = 0; y < image.height(); y += 3)
        for (int x = 0; x < image.width(); x += 3) {
            const QColor c(image.pixel(x, y));
            if (std::abs(c.red() - c.green()) > 60 || std::abs(c.green() - c.blue()) > 60)
                ++coloured;
        }
    QVERIFY2(coloured > 2000, qPrintable(QString::number(coloured)));
}

void TestReport::checkExitCodes()
{
    auto run = [](const QStringList& args, QString* output = nullptr) {
        QProcess p;
        p.start(KVSCOPE_BINARY, args);
        p.waitForFinished(120000);
        if (output)
            *output = p.readAllStandardOutput() + p.readAllStandardError();
        return p.exitCode();
    };
    synth::ModelCaptureOptions o = kvtest::smallModel();
    const QString clean = m_dir.filePath("clean.h5"), faulty = m_dir.filePath("faulty.h5");
    synth::writeModelCapture(clean.toStdString(), o);
    o.fault = synth::FaultKind::RopeOffset;
    synth::writeModelCapture(faulty.toStdString(), o);
    QString text;
    QCOMPARE(run({"check", clean}, &text), 0);
    QVERIFY(text.contains("PASS"));
    const QString json = m_dir.filePath("check.json");
    QCOMPARE(run({"check", faulty, "--json", json}, &text), 1);
    QVERIFY2(text.contains("FAIL prompt prompt_0, model.layers.3.self_attn"), qPrintable(text));
    QFile f(json);
    QVERIFY(f.open(QIODevice::ReadOnly));
    const nlohmann::json verdict = nlohmann::json::parse(f.readAll().toStdString());  // strict
    QCOMPARE(verdict["passed"].get<bool>(), false);
    QVERIFY(!verdict["violations"].empty());
    // Thresholds are the user's: loose enough, the faulty capture passes.
    QCOMPARE(run({"check", faulty, "--max-ratio", "1000", "--min-bc", "0"}, &text), 1);  // the suspect still fails it
    QVERIFY2(text.contains("suspect: position"), qPrintable(text));
    QCOMPARE(run({"check", faulty, "--max-ratio", "1000", "--min-bc", "0", "--suspect-floor", "1e9"}), 0);
    const QString broken = m_dir.filePath("broken.h5");
    QFile::copy(clean, broken);
    QFile(broken).resize(QFile(broken).size() / 2);
    QCOMPARE(run({"check", broken}, &text), 2);
    QVERIFY(text.contains(broken));
    QCOMPARE(run({"check", m_dir.filePath("missing.h5")}), 2);
    // A report's folder that cannot be made: it and why, exit 2.
    QCOMPARE(run({"report", clean, "-o", broken + "/report"}, &text), 2);
    QVERIFY2(text.contains(broken + "/report: the report's folder cannot be created (Not a directory)"), qPrintable(text));
    // The app's screenshot mode on a bundle it cannot open: the reason, exit 2, no wait.
    QProcess app;
    QProcessEnvironment env = QProcessEnvironment::systemEnvironment();
    env.insert("QT_QPA_PLATFORM", "offscreen");
    app.setProcessEnvironment(env);
    const QString shot = m_dir.filePath("never.png");
    app.start(KVSCOPE_BINARY, {broken, "--screenshot", shot});
    QVERIFY(app.waitForFinished(60000));
    QCOMPARE(app.exitCode(), 2);
    QVERIFY2(app.readAllStandardError().contains(broken.toUtf8()), "the message names the file");
    QVERIFY(!QFileInfo::exists(shot));
}

void TestReport::bundleIsNeverModified()
{
    // Input files are read only: same bytes, same modification time after every command.
    const QString bundle = m_dir.filePath("readonly.h5");
    QFile::copy(m_bundle, bundle);
    QFile::setPermissions(bundle, QFileDevice::ReadOwner | QFileDevice::ReadGroup | QFileDevice::ReadOther);
    auto digest = [&] {
        QFile f(bundle);
        f.open(QIODevice::ReadOnly);
        return QCryptographicHash::hash(f.readAll(), QCryptographicHash::Sha256);
    };
    const QByteArray before = digest();
    const QDateTime modified = QFileInfo(bundle).lastModified();
    QTest::qWait(20);  // a write now would show in the time
    for (const QStringList& args : QList<QStringList>{{"inspect", bundle},
                                                      {"analyze", bundle},
                                                      {"analyze", bundle, "--json", m_dir.filePath("ro.json")},
                                                      {"check", bundle},
                                                      {"report", bundle, "-o", m_dir.filePath("ro-report")},
                                                      {"export", bundle, m_dir.filePath("ro-export.h5")}}) {
        QProcess p;
        p.setProcessEnvironment(QProcessEnvironment::systemEnvironment());
        p.start(KVSCOPE_BINARY, args);
        QVERIFY(p.waitForFinished(120000));
        QVERIFY2(p.exitStatus() == QProcess::NormalExit && p.exitCode() <= 1, qPrintable(args.join(' ') + ": " + p.readAllStandardError()));
        QCOMPARE(QFileInfo(bundle).lastModified(), modified);
        QCOMPARE(digest(), before);
    }
}

void TestReport::againstComparesWithA()
{
    // kvscope report B --against A: the comparison first, its B - A maps equal to B's cell
    // ratios minus A's, recomputed in double from both analyses.
    const std::string pathA = m_dir.filePath("against_a.h5").toStdString(), pathB = m_dir.filePath("against_b.h5").toStdString();
    kvscope::synth::ModelCaptureOptions o = kvtest::smallModel();
    const AnalysisResult a = kvtest::analyseModelCapture(pathA, o);
    o.fault = kvscope::synth::FaultKind::HeadKScale;
    o.faultLayer = 3;
    const AnalysisResult b = kvtest::analyseModelCapture(pathB, o);
    const auto reader = std::make_shared<BundleReader>(pathB);
    const CaptureLoader loader(reader);
    const DiffResult diff = diffAnalyses(diffSideOf(a), b, loader, {});
    const ReportFiles files = writeReport(loader, b, Thresholds{}, m_dir.filePath("report-against"), nullptr, &diff);
    QFile f(files.html);
    QVERIFY(f.open(QIODevice::ReadOnly));
    const std::string html = f.readAll().toStdString();
    QVERIFY(html.find("Against A") < html.find("<h2>Suspects</h2>"));
    QVERIFY(html.find("B is worse in 1 layer(s)") != std::string::npos);
    QVERIFY(html.find("<h3>Regressions</h3>") != std::string::npos);
    const std::string open = "id=\"kvscope-data\">";
    const std::size_t begin = html.find(open) + open.size(), end = html.find("</script>", begin);
    const nlohmann::json data = nlohmann::json::parse(html.substr(begin, end - begin));
    int checked = 0;
    for (const nlohmann::json& map : data["maps"]) {
        const std::string id = map["id"];
        if (id.rfind("against_", 0) != 0 || id.find("_change") == std::string::npos)
            continue;
        QCOMPARE(map["scale"]["kind"].get<std::string>(), std::string("change"));
        const std::size_t p = id.find("prompt_1") != std::string::npos ? 1 : 0;
        const KvPart part = id.find("_k_change") != std::string::npos ? KvPart::K : KvPart::V;
        const std::int64_t columns = map["columns"];
        QCOMPARE(columns, b.prompts[p].tokens);
        for (int l = 0; l < int(b.prompts[p].layers.size()); ++l)
            for (std::int64_t t = 0; t < columns; ++t) {
                const double expected = kvtest::referenceCellRatio(b.prompts[p], l, t, part) -
                                        kvtest::referenceCellRatio(a.prompts[p], l, t, part);
                const nlohmann::json& v = map["values"][std::size_t(l * columns + t)];
                if (!std::isfinite(expected)) {
                    QVERIFY(v.is_null());
                    continue;
                }
                QVERIFY2(std::fabs(v.get<double>() - expected) <= 1e-3 * std::fabs(expected) + 1e-4,
                         qPrintable(QString("%1 layer %2 token %3: %4 against %5").arg(QString::fromStdString(id)).arg(l).arg(t)
                                        .arg(v.get<double>()).arg(expected)));
                ++checked;
            }
    }
    QVERIFY(checked > 100);
    QVERIFY(QFileInfo::exists(m_dir.filePath("report-against/against_prompt_0_k_change.png")));
    QVERIFY(QFileInfo::exists(m_dir.filePath("report-against/against_prompt_0_k_a.png")));
}

void TestReport::sweepReportNamesMapsByBundle()
{
    // A sweep's prompts are "BUNDLE/ID": their maps are files of the report's own folder, and
    // every one is drawn offline.
    QDir().mkpath(m_dir.filePath("sweep"));
    SyntheticCaptureOptions o;
    o.layers = 3;
    o.promptLens = {24, 32};
    o.decodeTokens = 8;
    o.divergence = -1;
    o.faultLayer = -1;
    for (const char* name : {"sweep/w1.h5", "sweep/w2.h5"}) {
        writeSyntheticCapture(m_dir.filePath(name).toStdString(), o);
        o.seed += 1;
    }
    const Sweep sweep = openSweep({m_dir.filePath("sweep").toStdString()}, UnreadableBlockPolicy::Error, nullptr);
    const AnalysisResult result = analyzeSweep(sweep);
    QCOMPARE(result.prompts.size(), std::size_t(4));
    const ReportFiles files = writeReport(*sweep.loader, result, Thresholds{}, m_dir.filePath("report-sweep"));
    // Per prompt 4 maps of K and V (no per-token BC vs noise: 128 values a token); 4 across
    // prompts; the sweep's worst cell over time.
    QCOMPARE(files.images.size(), qsizetype(4 * 8 + 4 + 1));
    QVERIFY(QFileInfo::exists(m_dir.filePath("report-sweep/over_time.png")));
    QFile html(files.html);
    QVERIFY(html.open(QIODevice::ReadOnly));
    const QString page = QString::fromUtf8(html.readAll());
    QVERIFY(page.contains("<h2>Over time</h2>") && page.contains("<td>w1</td>") && page.contains("<td>w2</td>"));
    for (const QString& image : files.images) {
        QCOMPARE(QFileInfo(image).absolutePath(), QDir(m_dir.filePath("report-sweep")).absolutePath());
        QVERIFY(QFileInfo::exists(image));
    }
    QVERIFY(QFileInfo::exists(m_dir.filePath("report-sweep/w2--prompt_1_k_ratio.png")));
    if (!QFileInfo::exists("/usr/bin/chromium"))
        return;
    QProcess dom;
    dom.start("/usr/bin/chromium", {"--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                                    "--user-data-dir=" + m_dir.filePath("chromium-sweep"), "--virtual-time-budget=5000",
                                    "--dump-dom", "file://" + files.html});
    QVERIFY(dom.waitForFinished(120000));
    QVERIFY2(QString(dom.readAllStandardOutput()).contains("data-maps-drawn=\"36\""), "not every map was drawn");
}

// A hybrid capture with a stale state in layer 2 of prompt_0: the Recurrent state table lists both
// mixers of each prompt, the stale one off (its worst in the fail style) with the words of its
// worst checkpoint, which are the analysis's own.
void TestReport::hybridReportHasTheRecurrentState()
{
    synth::ModelCaptureOptions o;
    o.hybrid = true;
    o.fault = synth::FaultKind::StateStale;
    o.threads = 1;
    const QString bundle = m_dir.filePath("hybrid.h5");
    synth::writeModelCapture(bundle.toStdString(), o);
    auto reader = std::make_shared<BundleReader>(bundle.toStdString());
    const CaptureLoader loader(reader);
    const AnalysisResult result = analyzeBundle(reader);
    const ReportFiles files = writeReport(loader, result, Thresholds{}, m_dir.filePath("report-hybrid"));
    QFile html(files.html);
    QVERIFY(html.open(QIODevice::ReadOnly));
    const QString page = QString::fromUtf8(html.readAll());
    QCOMPARE(page.count("<h3>Recurrent state</h3>"), int(result.prompts.size()));
    const PromptAnalysis& p = result.prompts.at(0);
    const StateLayerAnalysis& stale = p.states.at(1);
    QCOMPARE(stale.layer, std::string("model.layers.2.mixer"));
    QVERIFY2(page.contains("<td>model.layers.2.mixer</td>"), "the mixer's row");
    QVERIFY2(page.contains(QString::fromStdString(stateCellText(stale, 1)).toHtmlEscaped()), "its worst checkpoint's words");
    QVERIFY(page.contains("<td class=fail>" + QString::number(stale.worstRatio(1), 'g', 4) + "</td>"));
}

// A faulty capture with its impact record: each suspect's sentence under its evidence, and per
// prompt a row per layer whose figures are the record's own (the largest KL over its steps, read
// here from the bundle); without a record, neither.
void TestReport::impactInTheSuspectsAndPerLayer()
{
    synth::ModelCaptureOptions o = kvtest::smallModel(synth::FaultKind::RopeOffset);
    o.impactSchemes.clear();
    const QString bundle = m_dir.filePath("impact.h5");
    synth::writeModelCapture(bundle.toStdString(), o);
    auto reader = std::make_shared<BundleReader>(bundle.toStdString());
    const AnalysisResult result = analyzeBundle(reader);
    const ReportFiles files = writeReport(CaptureLoader(reader), result, Thresholds{}, m_dir.filePath("report-impact"));
    QFile html(files.html);
    QVERIFY(html.open(QIODevice::ReadOnly));
    const QString page = QString::fromUtf8(html.readAll());
    QVERIFY(!result.suspects.empty());
    for (const Suspect& s : result.suspects)
        if (s.impact)
            QVERIFY2(page.contains("<div class=impact>Output: " + QString::fromStdString(s.impact->text).toHtmlEscaped() + "</div>"),
                     qPrintable(QString::fromStdString(s.impact->text)));
    QVERIFY(std::any_of(result.suspects.begin(), result.suspects.end(), [](const Suspect& s) { return bool(s.impact); }));
    QCOMPARE(page.count("<h3>Impact on the output, per layer</h3>"), int(result.prompts.size()));
    // The fault's layer in prompt_0: the largest KL of its rows over the steps, to two digits.
    const std::string layer = "model.layers.3.self_attn";
    const ImpactRecord record = reader->readImpact("prompt_0").value();
    const auto largest = [&](TransplantKind kind) {
        double max = 0;
        const std::size_t row = record.find({kind, layer, {}}).value();
        for (std::int64_t g = 0; g < record.steps; ++g)
            max = std::max(max, record.kl[row * std::size_t(record.steps) + std::size_t(g)]);
        return max;
    };
    const double alone = largest(TransplantKind::Layer), noise = largest(TransplantKind::Baseline);
    int changed = 0;
    const std::size_t aloneRow = record.find({TransplantKind::Layer, layer, {}}).value();
    for (std::int64_t g = 0; g < record.steps; ++g)
        changed += record.top1Changed[aloneRow * std::size_t(record.steps) + std::size_t(g)];
    const QString row = QString("<tr><td>%1</td><td>%2</td><td>%3</td><td%4>%5x</td><td>%6 of %7</td><td>%8</td><td>%9</td></tr>")
                            .arg(QString::fromStdString(layer), QString::asprintf("%.2g", alone), QString::asprintf("%.2g", noise),
                                 QString(alone > 4 * noise ? " class=fail" : ""), QString::asprintf(alone / noise >= 10 ? "%.0f" : "%.1f", alone / noise))
                            .arg(changed)
                            .arg(record.steps)
                            .arg(QString::asprintf("%.2g", largest(TransplantKind::From)),
                                 QString::asprintf("%.2g", largest(TransplantKind::BaselineFrom)));
    QVERIFY2(page.contains(row), qPrintable(row));
    QVERIFY2(alone > 4 * noise, "the RoPE fault's layer is beyond its noise");

    // Without a record: no sentence, no table.
    o.impact = false;
    const QString without = m_dir.filePath("no-impact.h5");
    synth::writeModelCapture(without.toStdString(), o);
    auto plain = std::make_shared<BundleReader>(without.toStdString());
    const ReportFiles none = writeReport(CaptureLoader(plain), analyzeBundle(plain), Thresholds{}, m_dir.filePath("report-no-impact"));
    QFile noneHtml(none.html);
    QVERIFY(noneHtml.open(QIODevice::ReadOnly));
    const QString nonePage = QString::fromUtf8(noneHtml.readAll());
    QVERIFY(nonePage.contains("<h2>Suspects</h2>") && nonePage.contains("rope_offset"));
    QVERIFY(!nonePage.contains("Impact on the output") && !nonePage.contains("class=impact>"));
}

// What-if by output: a model whose KV head 0 of layers 1 and 4 an fp8 tensor scale crushes; the
// report's what-if proposes vLLM's arguments keeping exactly those in bf16, each with its KL and
// noise read here from the bundle; without an impact record, no such part.
void TestReport::whatIfByOutput()
{
    synth::ModelCaptureOptions o = kvtest::quietHeadModel();
    const auto pageOf = [&](const QString& name) {
        const QString bundle = m_dir.filePath(name + ".h5");
        synth::writeModelCapture(bundle.toStdString(), o);
        auto reader = std::make_shared<BundleReader>(bundle.toStdString());
        const CaptureLoader loader(reader);
        WhatIfOptions options;
        options.schemes = {{QuantScheme::Format::Fp8E4M3, QuantScheme::Scaling::Tensor}};
        const WhatIfResult whatIf = runWhatIf(loader, options);
        const ReportFiles files = writeReport(loader, analyzeBundle(reader), Thresholds{}, m_dir.filePath("report-" + name), &whatIf);
        QFile html(files.html);
        return html.open(QIODevice::ReadOnly) ? QString::fromUtf8(html.readAll()) : QString();
    };
    const QString page = pageOf("quiet");
    QVERIFY(page.contains("<h3>By output</h3>"));
    QVERIFY2(page.contains("<code>--kv-cache-dtype fp8_e4m3 --kv-cache-dtype-skip-layers 1 4</code>"), "the recipe");
    QCOMPARE(page.count("<tr><td>fp8_e4m3/tensor</td><td>model.layers."), 2);
    o.impact = false;
    const QString plain = pageOf("quiet-no-impact");
    QVERIFY(plain.contains("<h2>What if the cache were quantised?</h2>"));
    QVERIFY(!plain.contains("<h3>By output</h3>"));
}

QTEST_MAIN(TestReport)
#include "tst_report.moc"

// `kvscope report` and `kvscope check` judge the same analysis with the same options: check's
// exit 0 / 1 is the report's PASS / FAIL, and a bundle check refuses (2) gets no report.
void TestReport::reportAndCheckAgree()
{
    auto run = [](const QStringList& args) {
        QProcess p;
        p.start(KVSCOPE_BINARY, args);
        p.waitForFinished(120000);
        return p.exitCode();
    };
    synth::ModelCaptureOptions o = kvtest::smallModel();
    const QString clean = m_dir.filePath("agree-clean.h5"), faulty = m_dir.filePath("agree-faulty.h5");
    synth::writeModelCapture(clean.toStdString(), o);
    o.fault = synth::FaultKind::RopeOffset;
    synth::writeModelCapture(faulty.toStdString(), o);
    // A block id beyond the pool: lenient analyses mark those positions absent, check refuses.
    const QString badBlock = m_dir.filePath("agree-bad-block.h5");
    QFile::copy(clean, badBlock);
    const hid_t file = H5Fopen(badBlock.toUtf8().constData(), H5F_ACC_RDWR, H5P_DEFAULT);
    for (const char* group : {"group_0", "group_1"}) {  // the full-attention group's first block is always read
        const std::string table = std::string("/prompts/prompt_0/engine/snapshot_0/block_tables/") + group;
        const hid_t d = H5Dopen2(file, table.c_str(), H5P_DEFAULT);
        const hid_t space = H5Dget_space(d);
        std::vector<std::int32_t> entries(std::size_t(H5Sget_simple_extent_npoints(space)));
        H5Dread(d, H5T_NATIVE_INT32, H5S_ALL, H5S_ALL, H5P_DEFAULT, entries.data());
        entries[0] = 999999;
        H5Dwrite(d, H5T_NATIVE_INT32, H5S_ALL, H5S_ALL, H5P_DEFAULT, entries.data());
        H5Sclose(space), H5Dclose(d);
    }
    H5Fclose(file);
    const QStringList loose{"--max-ratio", "1000", "--min-bc", "0", "--suspect-floor", "1e9"};
    const struct {
        QString bundle;
        QStringList options;
        int verdict;  // check's exit code
    } cases[] = {{clean, {}, 0}, {faulty, {}, 1}, {faulty, loose, 0}, {badBlock, {}, 2}};
    int i = 0;
    for (const auto& c : cases) {
        const QString what = c.bundle + " " + c.options.join(' ');
        QVERIFY2(run(QStringList{"check", c.bundle} + c.options) == c.verdict, qPrintable(what));
        const QString dir = m_dir.filePath(QString("agree-report-%1").arg(i++));
        const int reported = run(QStringList{"report", c.bundle, "-o", dir} + c.options);
        if (c.verdict == 2) {
            QVERIFY2(reported == 2, qPrintable(what));
            QVERIFY(!QFileInfo::exists(dir + "/report.html"));
            continue;
        }
        QVERIFY2(reported == 0, qPrintable(what));
        QFile html(dir + "/report.html");
        QVERIFY(html.open(QIODevice::ReadOnly));
        const QByteArray text = html.readAll();
        QVERIFY2(text.contains(c.verdict == 0 ? "<span class=pass>PASS</span>" : "<span class=fail>FAIL</span>"),
                 qPrintable(what));
    }
}
