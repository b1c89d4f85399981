#include "commands/entry.h"

#include "commands/commands.h"
#include "commands/crash_guard.h"
#include "util/sibling_executables.h"
#include "util/version.h"

#include <malloc.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <set>
#include <string>
#include <vector>

namespace kvscope::cli {

int runCommandLine(int argc, char** argv, RunCommand (*appCommand)(const std::string& name),
                   int (*openApp)(int argc, char** argv))
{
    // The analysis allocates and frees buffers below BufferAllocator's 2 MiB (a rank's blocks,
    // per-token statistics) layer after layer: keep them in the heap rather than handing them
    // back to the kernel and faulting them in again.
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
        printOverview(std::cout);
        return 0;
    }
    if (first == "--version") {
        std::cout << "kvscope " << kVersion << "\n";
        return 0;
    }
    if (const Command* command = findCommand(first)) {
        const Args rest(args.begin() + 1, args.end());
        if (rest.size() == 1 && (rest[0] == "--help" || rest[0] == "-h")) {
            printUsage(first, std::cout);
            return 0;
        }
        const RunCommand runCommand = command->run ? command->run : appCommand ? appCommand(first) : nullptr;
        if (!runCommand)  // kvscope-app's, or kvscope-bench's
            return execSibling(command->executable, argc, argv);
        auto run = [&] {
            try {
                return runCommand(rest, std::cout, std::cerr);
            } catch (const std::exception& e) {
                std::cerr << "kvscope: " << e.what() << "\n";
                return 2;
            }
        };
        // The commands that read a bundle with libhdf5, which a corrupt file can crash.
        static const std::set<std::string> readBundles{"analyze", "check", "report", "inspect", "export", "transfer"};
        // The bundle is the first argument that is a file (options may come first).
        const auto bundle = std::find_if(rest.begin(), rest.end(), [](const std::string& a) {
            std::error_code error;
            return !a.starts_with("-") && std::filesystem::is_regular_file(a, error);
        });
        if (readBundles.count(first) && bundle != rest.end())
            return runGuarded(run, *bundle, std::cerr);
        return run();
    }
    if (first.starts_with("-")) {
        std::cerr << "kvscope: unknown option " << first << "\n";
        printOverview(std::cerr);
        return 2;
    }
    if (args.size() > 1 && !(args.size() >= 3 && args[1] == "--screenshot")) {
        std::cerr << "kvscope: '" << first << "' is not a command, and the app takes one bundle or folder (a sweep: a folder of bundles)\n";
        printOverview(std::cerr);
        return 2;
    }
    return openApp(argc, argv);
}

int execSibling(const std::string& executable, int argc, char** argv)
{
    const std::string override = executable == "kvscope-bench" ? "KVSCOPE_BENCH" : "KVSCOPE_APP";
    const std::string path = siblingExecutable(executable, override.c_str());
    std::error_code error;
    const std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe", error);
    if (!error)
        setenv("KVSCOPE_CLI", self.c_str(), 0);
    std::vector<char*> arguments(argv, argv + argc);
    arguments.push_back(nullptr);
    execv(path.c_str(), arguments.data());
    std::cerr << "kvscope: cannot run " << path << ": " << std::strerror(errno) << "\n";
    if (executable == "kvscope-bench")
        std::cerr << "kvscope: the benchmark is built with the source tree, not installed "
                     "(cmake --build build --target kvscope-bench)\n";
    return 2;
}

int execApp(int argc, char** argv)
{
    return execSibling("kvscope-app", argc, argv);
}

}  // namespace kvscope::cli
