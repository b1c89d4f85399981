#include "commands/crash_guard.h"

#include "format/bundle_error.h"
#include "format/bundle_reader.h"
#include "util/partial_files.h"

#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <iostream>

#include <sys/wait.h>
#include <unistd.h>

namespace kvscope::cli {

namespace {

volatile sig_atomic_t guardedChild = 0;

// Ctrl+C, kill or a scheduler's stop reaches the parent; the work is in the child.
extern "C" void forwardToChild(int signal)
{
    if (guardedChild > 0)
        ::kill(pid_t(guardedChild), signal);
}

bool isStopRequest(int signal)
{
    return signal == SIGINT || signal == SIGTERM || signal == SIGHUP;
}

}  // namespace

int runGuarded(const std::function<int()>& command, const std::string& input, std::ostream& err)
{
#if defined(__SANITIZE_THREAD__)
    (void)input, (void)err;
    return command();  // ThreadSanitizer does not support threads after fork(): unguarded there
#endif
    std::cout.flush();
    std::cerr.flush();
    // A corrupt file can also make libhdf5 loop for ever on its metadata, and an analysis may
    // rightly take long: the metadata is read first in a probe child with a time limit.
    if (std::error_code ec; std::filesystem::is_regular_file(input, ec)) {
        try {
            BundleReader::probeInChild(input);
        } catch (const BundleError& e) {
            err << "kvscope: " << e.what() << "\n";
            return 2;
        }
    }
    const pid_t child = fork();
    if (child < 0) {
        removePartialFilesOnTermination();
        return command();  // cannot fork: run unguarded rather than not at all
    }
    if (child == 0) {
        removePartialFilesOnTermination();
        const int code = command();
        std::cout.flush();
        std::cerr.flush();
        std::fflush(nullptr);
        _exit(code);  // no second run of the parent's exit handlers
    }
    guardedChild = child;
    struct sigaction forward = {}, previous[3] = {};
    forward.sa_handler = forwardToChild;
    const int stops[3] = {SIGINT, SIGTERM, SIGHUP};
    for (int i = 0; i < 3; ++i)
        if (sigaction(stops[i], nullptr, &previous[i]) == 0 && previous[i].sa_handler != SIG_IGN)
            sigaction(stops[i], &forward, nullptr);  // (one ignored on purpose, by nohup, stays so)
    int status = 0;
    while (waitpid(child, &status, 0) < 0 && errno == EINTR) {
    }
    for (int i = 0; i < 3; ++i)
        sigaction(stops[i], &previous[i], nullptr);
    guardedChild = 0;
    if (WIFEXITED(status))
        return WEXITSTATUS(status);
    if (isStopRequest(WTERMSIG(status))) {  // stopped on request: say so, as a shell would
        err << "kvscope: stopped (" << strsignal(WTERMSIG(status)) << ")\n";
        return 128 + WTERMSIG(status);
    }
    // The reader of our output went away (`kvscope analyze X | head`): not the file's fault.
    if (WTERMSIG(status) == SIGPIPE)
        return 128 + SIGPIPE;
    err << "kvscope: " << input << ": reading it crashed the HDF5 library (" << strsignal(WTERMSIG(status))
        << "): the file's metadata is corrupt; nothing was analysed\n";
    return 2;
}

}  // namespace kvscope::cli
