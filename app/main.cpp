// kvscope: the desktop app and its headless commands (app/cli/commands.h).

#include "cli/commands.h"
#include "cli/crash_guard.h"
#include "gui/gui_main.h"
#include "report/drawing_application.h"
#include "util/version.h"

#include <malloc.h>

#include <iostream>
#include <set>
#include <string>
#include <vector>

int main(int argc, char** argv)
{
    using namespace kvscope;
    // The analysis allocates and frees layer-sized buffers (megabytes) over and over: keep
    // them in the heap rather than handing them back to the kernel and faulting them in again.
    mallopt(M_MMAP_THRESHOLD, 512 << 20);
    mallopt(M_TRIM_THRESHOLD, 1024 << 20);
    // One arena for every thread: a worker's own arena gives its freed top back to the kernel
    // whatever the threshold, and the next layer faults it in again (measured: the faults of
    // an analysis 34,000 -> 20,000, its time -15% on two cores). Allocation is rare enough
    // that the threads do not queue on the one lock.
    mallopt(M_ARENA_MAX, 1);
    const std::vector<std::string> args(argv + 1, argv + argc);
    const std::string first = args.empty() ? "" : args[0];

    if (first == "--help" || first == "-h" || first == "help") {
        cli::printOverview(std::cout);
        return 0;
    }
    if (first == "--version") {
        std::cout << "kvscope " << kVersion << "\n";
        return 0;
    }
    if (const cli::Command* command = cli::findCommand(first)) {
        const cli::Args rest(args.begin() + 1, args.end());
        if (rest.size() == 1 && (rest[0] == "--help" || rest[0] == "-h")) {
            cli::printUsage(first, std::cout);
            return 0;
        }
        auto run = [&] {
            try {
                return command->run(rest, std::cout, std::cerr);
            } catch (const std::exception& e) {
                std::cerr << "kvscope: " << e.what() << "\n";
                return 2;
            }
        };
        // The commands that read a bundle with libhdf5, which a corrupt file can crash.
        static const std::set<std::string> readBundles{"analyze", "check", "report", "inspect", "export"};
        if (readBundles.count(first) && !rest.empty())
            return cli::runGuarded(run, rest.front(), std::cerr);
        return run();
    }
    if (first.starts_with("-")) {
        std::cerr << "kvscope: unknown option " << first << "\n";
        cli::printOverview(std::cerr);
        return 2;
    }
    // The app, on a bundle or a folder (or nothing); `--screenshot OUT [--across]` for the README.
    GuiLaunch launch{QString::fromStdString(first), {}, false};
    if (args.size() >= 3 && args[1] == "--screenshot") {
        launch.screenshot = QString::fromStdString(args[2]);
        launch.acrossPrompts = args.size() > 3 && args[3] == "--across";
    } else if (args.size() > 1) {
        std::cerr << "kvscope: '" << first << "' is not a command, and the app takes one bundle\n";
        cli::printOverview(std::cerr);
        return 2;
    }
    if (!hasDisplay() && qEnvironmentVariableIsEmpty("QT_QPA_PLATFORM")) {
        std::cerr << "kvscope: no display for the app; headless, use `kvscope report BUNDLE -o DIR` or "
                     "`kvscope analyze BUNDLE` (kvscope --help lists the commands)\n";
        return 2;
    }
    return runGui(launch.screenshot.isEmpty() ? argc : 1, argv, launch);
}
