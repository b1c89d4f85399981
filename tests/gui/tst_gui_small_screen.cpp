// The app on a small screen: the offscreen platform given one 1024x700 screen (its
// configuration file), as a small laptop has. The window must open within it, with the side
// panel and the status bar on screen.

#include "gui_test_support.h"

#include "widgets/token_line_view.h"

#include <QApplication>
#include <QFile>
#include <QProgressBar>
#include <QPushButton>
#include <QScreen>
#include <QStatusBar>
#include <QTableView>

using namespace kvscope;
using namespace kvtest;

class TestSmallScreen : public QObject {
    Q_OBJECT

private slots:
    void initTestCase()
    {
        QStandardPaths::setTestModeEnabled(true);
        QSettings().clear();  // no size remembered from an earlier run
    }

    // The first size fits the screen's available area (at 1400x900 a 1280x800 laptop had the
    // side panel, the status bar and Cancel off screen).
    void opensWithinTheAvailableScreen()
    {
        MainWindow window;
        const QRect room = window.screen()->availableGeometry();
        QCOMPARE(room.size(), QSize(1024, 700));  // the configured screen
        window.show();
        QVERIFY(QTest::qWaitForWindowExposed(&window));
        QVERIFY2(room.contains(window.geometry()),
                 qPrintable(QString("%1x%2 in %3x%4").arg(window.width()).arg(window.height()).arg(room.width()).arg(room.height())));
        // and what was off screen is inside the window, with a bundle open too (the heads
        // table then asks for the width of its numbers).
        QTemporaryDir dir;
        const QString path = dir.filePath("demo.h5");
        SyntheticCaptureOptions options = demoCaptureOptions();
        options.kvHeads = 8;  // the heads table as wide as a real model's numbers make it
        writeSyntheticCapture(path.toStdString(), options);
        QSignalSpy finished(&window.controller(), &AnalysisController::finished);
        window.openPath(path);
        QVERIFY(finished.wait(60000));
        promptPageOf(window).selectCell(5, 50);
        QCoreApplication::processEvents();
        QVERIFY2(room.contains(window.geometry()),
                 qPrintable(QString("%1x%2 in %3x%4").arg(window.width()).arg(window.height()).arg(room.width()).arg(room.height())));
        for (QWidget* part : std::initializer_list<QWidget*>{window.statusBar(), &promptPageOf(window).worstCellsView(),
                                                             static_cast<QWidget*>(&drillDownOf(window).line())}) {
            const QRect at(part->mapTo(&window, QPoint(0, 0)), part->size());
            QVERIFY2(window.rect().contains(at), part->metaObject()->className());
        }
    }

    // A size remembered from a larger screen (1264x752 from a 1280x800 one) is clamped to this one.
    void aLargerSavedSizeIsClamped()
    {
        {
            MainWindow larger;
            larger.show();
            larger.setGeometry(40, 30, 1264, 752);
            QCOMPARE(larger.size(), QSize(1264, 752));  // (offscreen windows take any size)
            larger.close();                             // remembered here
        }
        MainWindow window;
        window.show();
        QVERIFY(QTest::qWaitForWindowExposed(&window));
        const QRect room = window.screen()->availableGeometry();
        QVERIFY2(room.contains(window.geometry()),
                 qPrintable(QString("%1x%2+%3+%4 in %5x%6").arg(window.width()).arg(window.height()).arg(window.x()).arg(window.y())
                                .arg(room.width()).arg(room.height())));
    }
};

int main(int argc, char** argv)
{
    // One screen of 1024x700 for the offscreen platform (Qt reads it when the app starts).
    QTemporaryDir dir;
    const QString config = dir.filePath("screen.json");
    QFile file(config);
    if (!file.open(QIODevice::WriteOnly))
        return 1;
    file.write(R"({"screens": [{"name": "small", "x": 0, "y": 0, "width": 1024, "height": 700,
                   "logicalDpi": 96, "logicalBaseDpi": 96, "dpr": 1}]})");
    file.close();
    qputenv("QT_QPA_PLATFORM", ("offscreen:configfile=" + config).toUtf8());
    QApplication app(argc, argv);
    TestSmallScreen test;
    return QTest::qExec(&test, argc, argv);
}

#include "tst_gui_small_screen.moc"
