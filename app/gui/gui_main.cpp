#include "gui/gui_main.h"

#include "gui/main_window.h"

#include <QApplication>
#include <QTimer>

#include <iostream>

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
    if (!launch.screenshot.isEmpty()) {
        QObject::connect(&window.controller(), &AnalysisController::finished, &window, [&] {
            window.showAcrossPrompts(launch.acrossPrompts);
            QTimer::singleShot(1500, &window, [&] {
                window.grab().save(launch.screenshot);
                app.quit();
            });
        });
        // A bundle that cannot be opened: say why and stop, rather than wait for ever.
        QObject::connect(&window.controller(), &AnalysisController::failed, &window, [&](const QString& message) {
            std::cerr << "kvscope: " << message.toStdString() << "\n";
            app.exit(2);
        });
    }
    if (!launch.makeArgv.empty())
        window.controller().openMade(launch.path, launch.makeArgv, launch.making);
    else if (!launch.path.isEmpty())
        window.openPath(launch.path);
    return app.exec();
}

}  // namespace kvscope
