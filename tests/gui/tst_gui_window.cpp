// The window as a frame: what it says with nothing open, its size on the screen, the layout
// it remembers, its toolbar and status bar.

#include "gui_test_support.h"

#include "gui/head_table_model.h"
#include "gui/worst_cells_model.h"
#include "widgets/histogram_view.h"
#include "widgets/plot_export.h"
#include "widgets/token_line_view.h"

#include <QAbstractItemModelTester>
#include <QApplication>
#include <QComboBox>
#include <QDir>
#include <QElapsedTimer>
#include <QFile>
#include <QHeaderView>
#include <QImage>
#include <QListWidget>
#include <QScrollBar>
#include <QSortFilterProxyModel>
#include <QStatusBar>
#include <QTableView>
#include <QTabWidget>
#include <QToolBar>
#include <QWheelEvent>

#include <atomic>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <future>

using namespace kvscope;
using namespace kvtest;

class TestWindow : public GuiSuite {
    Q_OBJECT

private slots:
    void initTestCase() { initDemo(); }
    void emptyStateSaysWhatToDo();
    void layoutFitsAt1280x800AndIsRemembered();
    void toolbarIsOffUntilSomethingIsOpen();
};

void TestWindow::emptyStateSaysWhatToDo()
{
    MainWindow fresh;
    fresh.resize(1280, 800);
    fresh.show();
    QVERIFY(QTest::qWaitForWindowExposed(&fresh));
    QVERIFY(heatmapOf(fresh).isEmpty());
    QVERIFY(!heatmapOf(fresh).colorScale()->visible());  // no scale that reads as "zero error"
    QCOMPARE(promptPageOf(fresh).worstCells().rowCount(), 0);
    QCOMPARE(headTableOf(fresh).rowCount(), 0);
    int row;
    qint64 token;
    QVERIFY(!heatmapOf(fresh).cellAt(heatmapOf(fresh).axisRect()->center(), row, token));
}

void TestWindow::layoutFitsAt1280x800AndIsRemembered()
{
    ensureDemoOpen();
    toolbarOf(*m_window).setMetric(HeatmapMetric::ErrorRatio);
    m_window->resize(1280, 800);
    promptPageOf(*m_window).selectCell(5, 50);
    QCoreApplication::processEvents();
    heatmapOf(*m_window).replot(QCustomPlot::rpImmediateRefresh);
    // Every layer labelled.
    auto ticker = qSharedPointerDynamicCast<QCPAxisTickerText>(heatmapOf(*m_window).yAxis->ticker());
    QCOMPARE(ticker->ticks().size(), 8);
    // The worst cells' columns (the ranking key included) and the current part's head columns
    // fit without a horizontal scroll; the head numbers are a fixed header.
    QTableView& worst = promptPageOf(*m_window).worstCellsView();
    QTRY_COMPARE(worst.horizontalScrollBar()->maximum(), 0);
    QTableView& heads = promptPageOf(*m_window).drillDown().headView();
    QTRY_COMPARE(heads.horizontalScrollBar()->maximum(), 0);
    QVERIFY(heads.verticalHeader()->isVisible());
    QCOMPARE(heads.model()->headerData(0, Qt::Vertical).toString().left(4), QString("head"));
    // Splitter sizes are remembered.
    QSplitter& split = promptPageOf(*m_window).mapSplitter();
    split.setSizes({300, 400});
    const QList<int> chosen = split.sizes();
    m_window->close();
    MainWindow again;
    again.resize(1280, 800);
    again.show();
    QVERIFY(QTest::qWaitForWindowExposed(&again));
    QCOMPARE(promptPageOf(again).mapSplitter().sizes(), chosen);
    m_window->show();
}

void TestWindow::toolbarIsOffUntilSomethingIsOpen()
{
    MainWindow fresh;
    fresh.show();
    QVERIFY(QTest::qWaitForWindowExposed(&fresh));
    ViewToolbar& toolbar = toolbarOf(fresh);
    QVERIFY(!toolbar.isEnabled());
    QVERIFY(!toolbar.promptBox().isEnabled());  // every control in it, through its parent
    QVERIFY(showAndAnalyse(fresh, m_path));
    QVERIFY(toolbar.isEnabled());
    QVERIFY(toolbar.promptBox().isEnabled());
}


QTEST_MAIN(TestWindow)
#include "tst_gui_window.moc"
