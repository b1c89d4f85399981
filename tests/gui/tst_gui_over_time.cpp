// The "Over time" page under QT_QPA_PLATFORM=offscreen: a folder of four captures opened as one
// sweep, the last two with a RoPE fault in one layer. The page is shown once the analysis has
// finished, off the GUI thread; its map has a column a capture and a row a layer, loud only where
// the fault is; the line has a point a capture, the faulty ones off the floor.

#include "gui_test_support.h"

#include "gui/over_time_page.h"
#include "widgets/heatmap_view.h"

#include <QSignalSpy>
#include <QTabWidget>

using namespace kvscope;
using namespace kvtest;

class TestOverTime : public GuiSuite {
    Q_OBJECT

private slots:
    void initTestCase() { initDemo(); }
    void aSoakRunOverTime();
};

void TestOverTime::aSoakRunOverTime()
{
    QDir folder(m_dir.filePath("soak"));
    QVERIFY(QDir().mkpath(folder.path()));
    constexpr int kFaultLayer = 5;
    for (int i = 0; i < 4; ++i) {
        SyntheticCaptureOptions o;
        o.seed = 11 + std::uint64_t(i);
        o.faultLayer = i >= 2 ? kFaultLayer : -1;
        writeSyntheticCapture(folder.filePath(QString("capture_%1.h5").arg(i)).toStdString(), o);
    }
    auto& page = *m_window->findChild<OverTimePage*>();
    QSignalSpy shown(&page, &OverTimePage::timelineShown);
    QSignalSpy finished(&m_window->controller(), &AnalysisController::finished);
    m_window->openPath(folder.path());
    QVERIFY(finished.wait(60000));
    QVERIFY(shown.count() > 0 || shown.wait(30000));
    QVERIFY2(page.unavailable().isEmpty(), qPrintable(page.unavailable()));
    auto* tabs = m_window->findChild<QTabWidget*>();
    QVERIFY(tabs->isTabEnabled(tabs->indexOf(&page)));

    const SweepTimeline& t = *page.timeline();
    QVERIFY(t.perBundle);
    QCOMPARE(t.points.size(), std::size_t(4));
    QCOMPARE(t.points[2].name, std::string("capture_2"));
    QCOMPARE(t.points[0].prompts, 2);
    // The map: loud (over the off threshold) at the fault's layer in the faulty captures only.
    const HeatmapGrid& grid = page.heatmap().grid();
    QCOMPARE(grid.rows, 8);
    QCOMPARE(grid.columns, std::int64_t(4));
    for (int layer = 0; layer < grid.rows; ++layer)
        for (int capture = 0; capture < 4; ++capture) {
            const float v = grid.at(layer, capture);
            if (layer == kFaultLayer && capture >= 2)
                QVERIFY2(v > 1, qPrintable(QString("layer %1 capture %2: %3").arg(layer).arg(capture).arg(v)));
            else
                QVERIFY2(v < 1, qPrintable(QString("layer %1 capture %2: %3").arg(layer).arg(capture).arg(v)));
        }
    QVERIFY(t.points[3].offFraction > 0);
    QCOMPARE(t.points[0].offFraction, 0.0);
}

QTEST_MAIN(TestOverTime)
#include "tst_gui_over_time.moc"
