#pragma once
// What the app's suites share: the demo capture written once per suite and its analysis
// computed here, without the GUI; a window to drive; the window's parts found by objectName
// (the window has no accessors for tests); and the independent computations the views are
// checked against.

#include "analysis/analyzer.h"
#include "format/bundle_reader.h"
#include "gui/across_prompts_page.h"
#include "gui/drill_down_panel.h"
#include "gui/main_window.h"
#include "gui/prompt_page.h"
#include "gui/view_toolbar.h"
#include "synth/synthetic_capture.h"
#include "widgets/heatmap_view.h"

#include <QRegularExpression>
#include <QSettings>
#include <QSignalSpy>
#include <QStandardPaths>
#include <QTemporaryDir>
#include <QTest>

#include <algorithm>
#include <cmath>
#include <memory>
#include <vector>

namespace kvtest {

using namespace kvscope;

// A part of `window` by its objectName (set where the part is built).
template <class T>
T& partOf(QWidget& window, const char* name)
{
    T* part = window.findChild<T*>(name);
    if (!part)
        qFatal("no %s named %s", T::staticMetaObject.className(), name);
    return *part;
}
inline PromptPage& promptPageOf(QWidget& w) { return partOf<PromptPage>(w, "promptPage"); }
inline AcrossPromptsPage& acrossPageOf(QWidget& w) { return partOf<AcrossPromptsPage>(w, "acrossPrompts"); }
inline ViewToolbar& toolbarOf(QWidget& w) { return partOf<ViewToolbar>(w, "view"); }
inline DrillDownPanel& drillDownOf(QWidget& w) { return partOf<DrillDownPanel>(w, "drillDown"); }
inline HeatmapView& heatmapOf(QWidget& w) { return promptPageOf(w).heatmap(); }
// The map is built off the GUI thread: wait until it shows what was last asked for.
inline void waitForMap(QWidget& w)
{
    QTRY_VERIFY(promptPageOf(w).mapUpToDate());
}
inline HeadTableModel& headTableOf(QWidget& w) { return drillDownOf(w).headTable(); }

// The demo capture (8 layers, the fault at layer 5 head 1 from token 46) and one window.
class GuiSuite : public QObject {
protected:
    void initDemo()
    {
        QStandardPaths::setTestModeEnabled(true);  // recent files go to a test location
        QSettings().clear();                       // and start empty: no layout of an earlier run
        m_path = m_dir.filePath("demo.h5");
        writeSyntheticCapture(m_path.toStdString(), demoCaptureOptions());
        m_reader = std::make_shared<BundleReader>(m_path.toStdString());
        m_reference = analyzeBundle(m_reader);
        m_window = std::make_unique<MainWindow>();
        m_window->resize(1400, 900);
        m_window->show();
        QVERIFY(QTest::qWaitForWindowExposed(m_window.get()));
    }

    void openDemo()
    {
        QSignalSpy finished(&m_window->controller(), &AnalysisController::finished);
        m_window->openPath(m_path);
        QVERIFY(finished.wait(60000));
    }

    void ensureDemoOpen()
    {
        if (m_window->controller().path() != m_path || !m_window->controller().result() || m_window->controller().isRunning())
            openDemo();
        m_window->showAcrossPrompts(false);
        toolbarOf(*m_window).setPrompt(0);
        m_window->activateWindow();  // window shortcuts need the active window
        QVERIFY(QTest::qWaitForWindowActive(m_window.get()));
    }

    QTemporaryDir m_dir;
    QString m_path;
    std::shared_ptr<BundleReader> m_reader;
    AnalysisResult m_reference;  // computed here, without the GUI
    std::unique_ptr<MainWindow> m_window;
};

// The cell ratio computed here from the stored per-head errors: the largest actual L-inf
// over heads divided by the largest base L-inf over heads (analysis_result.h).
inline double referenceRatio(const PromptAnalysis& p, KvPart part, int layer, qint64 token, int* worstHead = nullptr)
{
    const Metric actual = part == KvPart::K ? Metric::KLinf : Metric::VLinf;
    const Metric base = part == KvPart::K ? Metric::BaseKLinf : Metric::BaseVLinf;
    double a = -1, b = -1;
    for (int h = 0; h < p.heads; ++h) {
        const double va = p.value(actual, layer, token, h), vb = p.value(base, layer, token, h);
        if (!std::isnan(va) && va > a) {
            a = va;
            if (worstHead)
                *worstHead = h;
        }
        if (!std::isnan(vb))
            b = std::max(b, vb);
    }
    return a < 0 || b < 0 ? std::nan("") : a / std::max(b, 1e-10);
}

// A layer's off threshold on the map in floors, by the formula of docs/suspects.md for a hundred
// times the cells counted here (`timesTheCells` 1: the suspects' own, which a layer a suspect affects takes) (noise reaches it in one capture of a hundred): 6 floors + 2.6 a
// decade of cells beyond 1000 (every finite cell, K and V); two-way (a bf16 cache) plus the
// drift, 20 + 4 a decade, times sqrt(layer + 1).
inline double offThresholdByFormula(const PromptAnalysis& p, int layer, double timesTheCells = 100)
{
    // In a layer a suspect affects, the map takes the suspects' own threshold (the cells once).
    for (const Suspect& s : p.suspects)
        if (timesTheCells != 1 && std::find(s.layers.begin(), s.layers.end(), p.layers[std::size_t(layer)]) != s.layers.end())
            return offThresholdByFormula(p, layer, 1);
    double cells = 0;
    for (int l = 0; l < int(p.layers.size()); ++l)
        for (qint64 t = 0; t < p.tokens; ++t)
            for (int h = 0; h < p.heads; ++h)
                cells += std::isfinite(p.value(Metric::KL2, l, t, h)) ? 2 : 0;
    const double decades = std::max(0.0, std::log10(timesTheCells * cells / 1000.0));
    const double rounding = 6.0 + 2.6 * decades;
    return p.threeWay ? rounding : rounding + (20.0 + 4.0 * decades) * std::sqrt(layer + 1.0);
}

// The number after `label` in rich text: "<b>2.345</b>" or plain.
inline double numberAfter(const QString& text, const QString& label)
{
    const int at = text.indexOf(label);
    if (at < 0)
        return std::nan("");
    QString rest = text.mid(at + label.size());
    rest.remove(QRegularExpression("<[^>]*>"));
    const QRegularExpressionMatch m = QRegularExpression(R"(^\s*([-+0-9.eE]+))").match(rest);
    return m.hasMatch() ? m.captured(1).toDouble() : std::nan("");
}

// The 99th percentile (nearest rank) over the (layer, token) cells of the largest value of `m`
// over heads.
inline double percentile99OfCellMaxima(const PromptAnalysis& p, Metric m)
{
    std::vector<double> values;
    for (int l = 0; l < int(p.layers.size()); ++l)
        for (qint64 t = 0; t < p.tokens; ++t) {
            double largest = -1;
            for (int h = 0; h < p.heads; ++h)
                if (!std::isnan(p.value(m, l, t, h)))
                    largest = std::max(largest, double(p.value(m, l, t, h)));
            if (largest >= 0)
                values.push_back(largest);
        }
    std::sort(values.begin(), values.end());
    return values[std::min(values.size() - 1, std::size_t(0.99 * double(values.size())))];
}

// Shows `window` at 1280x800 and opens `path` in it; true once the analysis has finished.
inline bool showAndAnalyse(MainWindow& window, const QString& path)
{
    window.resize(1280, 800);
    window.show();
    QSignalSpy finished(&window.controller(), &AnalysisController::finished);
    window.openPath(path);
    return finished.wait(60000) && QTest::qWaitFor([&] { return promptPageOf(window).mapUpToDate(); }, 10000);
}

inline bool sameTo4Digits(double a, double b)
{
    if (std::isnan(a) || std::isnan(b))
        return std::isnan(a) && std::isnan(b);  // no data in both
    return std::abs(a - b) <= 5e-4 * std::max(std::abs(a), std::abs(b));
}

// The text of each tick label an axis draws, with the pixel span it covers: labels that
// overlap run together on screen.
inline bool tickLabelsOverlap(QCPAxis* axis)
{
    const QFontMetrics metrics(axis->tickLabelFont());
    const QVector<double> ticks = axis->tickVector();
    const QVector<QString> labels = axis->tickVectorLabels();
    double previousRight = -1e9;
    for (int i = 0; i < ticks.size() && i < labels.size(); ++i) {
        int width = 0;
        for (const QString& line : labels[i].split('\n'))
            width = std::max(width, metrics.horizontalAdvance(line));
        const double centre = axis->coordToPixel(ticks[i]);
        if (centre - width / 2.0 < previousRight)
            return true;
        previousRight = centre + width / 2.0;
    }
    return false;
}

}  // namespace kvtest
