// kvscope-app: the desktop app, and the commands that draw (report, demo); kvscope runs it
// for those (commands/entry.h), and it runs every other command itself too. Its own commands
// are in this folder (app_commands.h); the rest is commands/, which has no Qt.

#include "qt_commands/app_commands.h"
#include "commands/entry.h"
#include "gui/gui_main.h"
#include "report/drawing_application.h"

#include <iostream>
#include <string>

namespace {

// The app, on a bundle or a folder (or nothing); `--screenshot OUT [--across]` for the README.
int openApp(int argc, char** argv)
{
    using namespace kvscope;
    GuiLaunch launch{argc > 1 ? QString::fromStdString(argv[1]) : QString(), {}, false};
    if (argc >= 4 && std::string(argv[2]) == "--screenshot") {
        launch.screenshot = QString::fromStdString(argv[3]);
        launch.acrossPrompts = argc > 4 && std::string(argv[4]) == "--across";
    }
    if (!hasDisplay() && qEnvironmentVariableIsEmpty("QT_QPA_PLATFORM")) {
        std::cerr << "kvscope: no display for the app; headless, use `kvscope report BUNDLE -o DIR` or "
                     "`kvscope analyze BUNDLE` (kvscope --help lists the commands)\n";
        return 2;
    }
    return runGui(launch.screenshot.isEmpty() ? argc : 1, argv, launch);
}

}  // namespace

int main(int argc, char** argv)
{
    return kvscope::cli::runCommandLine(argc, argv, kvscope::cli::appCommand, openApp);
}
