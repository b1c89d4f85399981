#include "gui/gui_main.h"

#include "gui/main_window.h"

#include <QApplication>
#include <QTimer>

namespace kvscope {

int runGui(int argc, char** argv, const GuiLaunch& launch)
{
    QApplication app(argc, argv);
    QApplication::setOrganizationName("kvscope");
    QApplication::setApplicationName("kvscope");
    MainWindow window;
    if (!launch.screenshot.isEmpty())
        window.resize(1280, 800);  // the README's size, whatever was remembered
    window.show();
    if (!launch.screenshot.isEmpty())
        QObject::connect(&window.controller(), &AnalysisController::finished, &window, [&] {
            window.showAcrossPrompts(launch.acrossPrompts);
            QTimer::singleShot(1500, &window, [&] {
                window.grab().save(launch.screenshot);
                app.quit();
            });
        });
    if (!launch.path.isEmpty())
        window.openPath(launch.path);
    return app.exec();
}

}  // namespace kvscope
