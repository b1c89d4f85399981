#include "cli/crash_guard.h"

#include "format/bundle_error.h"
#include "format/bundle_reader.h"

#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <iostream>

#include <sys/wait.h>
#include <unistd.h>

namespace kvscope::cli {

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
    if (child < 0)
        return command();  // cannot fork: run unguarded rather than not at all
    if (child == 0) {
        const int code = command();
        std::cout.flush();
        std::cerr.flush();
        std::fflush(nullptr);
        _exit(code);  // no second run of the parent's exit handlers
    }
    int status = 0;
    while (waitpid(child, &status, 0) < 0 && errno == EINTR) {
    }
    if (WIFEXITED(status))
        return WEXITSTATUS(status);
    // The reader of our output went away (`kvscope analyze X | head`): not the file's fault.
    if (WTERMSIG(status) == SIGPIPE)
        return 128 + SIGPIPE;
    err << "kvscope: " << input << ": reading it crashed the HDF5 library (" << strsignal(WTERMSIG(status))
        << "): the file's metadata is corrupt; nothing was analysed\n";
    return 2;
}

}  // namespace kvscope::cli
