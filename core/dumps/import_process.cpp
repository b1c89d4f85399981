#include "dumps/import_process.h"

#include "format/bundle_error.h"
#include "util/sibling_executables.h"

#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <fcntl.h>
#include <filesystem>
#include <stdexcept>
#include <vector>

#include <poll.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

extern char** environ;

namespace kvscope {

std::string importHelperPath()
{
    return siblingExecutable("kvscope-import", "KVSCOPE_IMPORT_HELPER");
}

namespace {

// Whether the folder holds any file of a folder of dumps (docs/import.md): a folder that does
// is one with a file missing, which the importer names.
bool holdsAnyDump(const std::string& directory)
{
    std::error_code error;
    for (const auto& entry : std::filesystem::directory_iterator(directory, error)) {
        const std::string name = entry.path().filename().string();
        if (name == "kv_cache_config.json" || name == "prompt.json" || name == "block_tables.pt" ||
            name.starts_with("kv_caches_rank") || name.starts_with("expected.") || name.starts_with("baseline."))
            return true;
    }
    return false;
}

}  // namespace

void runImport(const std::string& directory, const std::string& bundlePath, const std::atomic<bool>* cancel)
{
    // A folder given by mistake (dropped on the app, or a typo): say what was given and what a
    // folder of dumps holds, rather than the importer's first complaint about a missing file.
    if (!std::filesystem::exists(directory))
        throw BundleError(directory, {}, "does not exist");
    if (!std::filesystem::is_directory(directory))
        throw BundleError(directory, {}, "is a file, not a folder of dumps (a capture bundle opens as it is: kvscope BUNDLE)");
    if (!holdsAnyDump(directory))
        throw BundleError(directory, {},
                          "is a folder, not a capture bundle (.h5), and not a folder of dumps either: a folder of dumps "
                          "holds kv_cache_config.json, prompt.json, kv_caches_rank<R>.pt for every TP rank, "
                          "block_tables.pt, and expected.pt or expected.safetensors (baseline.* for three-way); see "
                          "docs/import.md. To open a bundle, choose its file.");
    const std::string helper = importHelperPath();
    int pipeFds[2];
    if (pipe(pipeFds) != 0)
        throw BundleError(directory, "", std::string("cannot start the import: ") + std::strerror(errno));
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, pipeFds[1], STDERR_FILENO);
    posix_spawn_file_actions_addclose(&actions, pipeFds[0]);
    posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, "/dev/null", O_WRONLY, 0);
    std::vector<std::string> args{helper, directory, "-o", bundlePath};
    std::vector<char*> argv;
    for (std::string& a : args)
        argv.push_back(a.data());
    argv.push_back(nullptr);
    // Its own process group, so that cancelling stops whatever it started too.
    posix_spawnattr_t attributes;
    posix_spawnattr_init(&attributes);
    posix_spawnattr_setflags(&attributes, POSIX_SPAWN_SETPGROUP);
    posix_spawnattr_setpgroup(&attributes, 0);
    pid_t pid = 0;
    const int spawned = posix_spawn(&pid, helper.c_str(), &actions, &attributes, argv.data(), environ);
    posix_spawnattr_destroy(&attributes);
    posix_spawn_file_actions_destroy(&actions);
    close(pipeFds[1]);
    if (spawned != 0) {
        close(pipeFds[0]);
        throw BundleError(directory, "", "cannot run the import helper " + helper + ": " + std::strerror(spawned));
    }
    // Collect its messages until it exits, checking for cancellation in between.
    std::string messages;
    bool cancelled = false;
    for (;;) {
        pollfd fd{pipeFds[0], POLLIN, 0};
        const int ready = poll(&fd, 1, 100);
        if (cancel && *cancel) {
            cancelled = true;
            kill(-pid, SIGKILL);
            break;
        }
        if (ready > 0) {
            char buffer[4096];
            const ssize_t n = read(pipeFds[0], buffer, sizeof buffer);
            if (n <= 0)
                break;
            if (messages.size() < 65536)
                messages.append(buffer, std::size_t(n));
        } else if (ready < 0 && errno != EINTR) {
            break;
        }
    }
    close(pipeFds[0]);
    int status = 0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    if (cancelled) {
        std::error_code ignored;
        std::filesystem::remove(bundlePath, ignored);
        throw ImportCancelled{};
    }
    if (WIFEXITED(status) && WEXITSTATUS(status) == 0)
        return;
    // The helper prints "kvscope-import: <BundleError text>"; pass its message on.
    while (!messages.empty() && (messages.back() == '\n' || messages.back() == '\r'))
        messages.pop_back();
    const std::string prefix = "kvscope-import: ";
    if (messages.rfind(prefix, 0) == 0)
        messages.erase(0, prefix.size());
    if (WIFSIGNALED(status))
        messages = "the import helper crashed (signal " + std::to_string(WTERMSIG(status)) + ")" +
                   (messages.empty() ? "" : ": " + messages);
    else if (messages.empty())
        messages = "the import helper failed with exit code " + std::to_string(WEXITSTATUS(status));
    throw std::runtime_error(messages);  // already "file: object: problem"
}

}  // namespace kvscope
