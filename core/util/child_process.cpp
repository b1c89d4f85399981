#include "util/child_process.h"

#include <cerrno>
#include <csignal>
#include <cstring>
#include <fcntl.h>
#include <stdexcept>

#include <poll.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

extern char** environ;

namespace kvscope {

namespace {

pid_t spawnInOwnGroup(const std::vector<std::string>& args, int stderrFd, int closeFd)
{
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, stderrFd, STDERR_FILENO);
    posix_spawn_file_actions_addclose(&actions, closeFd);
    posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, "/dev/null", O_WRONLY, 0);
    std::vector<std::string> copies = args;
    std::vector<char*> argv;
    for (std::string& a : copies)
        argv.push_back(a.data());
    argv.push_back(nullptr);
    // Its own process group, so that cancelling stops whatever it started too.
    posix_spawnattr_t attributes;
    posix_spawnattr_init(&attributes);
    posix_spawnattr_setflags(&attributes, POSIX_SPAWN_SETPGROUP);
    posix_spawnattr_setpgroup(&attributes, 0);
    pid_t pid = 0;
    const int spawned = posix_spawn(&pid, argv[0], &actions, &attributes, argv.data(), environ);
    posix_spawnattr_destroy(&attributes);
    posix_spawn_file_actions_destroy(&actions);
    if (spawned != 0)
        throw std::runtime_error("cannot run " + args.front() + ": " + std::strerror(spawned));
    return pid;
}

}  // namespace

ChildExit runChildProcess(const std::vector<std::string>& argv, const std::atomic<bool>* cancel)
{
    int pipeFds[2];
    if (pipe(pipeFds) != 0)
        throw std::runtime_error("cannot run " + argv.front() + ": " + std::strerror(errno));
    pid_t pid = 0;
    try {
        pid = spawnInOwnGroup(argv, pipeFds[1], pipeFds[0]);
    } catch (...) {
        close(pipeFds[0]);
        close(pipeFds[1]);
        throw;
    }
    close(pipeFds[1]);
    // Collect its messages until it exits, checking for cancellation in between.
    ChildExit exit;
    for (;;) {
        pollfd fd{pipeFds[0], POLLIN, 0};
        const int ready = poll(&fd, 1, 100);
        if (cancel && *cancel) {
            exit.cancelled = true;
            kill(-pid, SIGKILL);
            break;
        }
        if (ready > 0) {
            char buffer[4096];
            const ssize_t n = read(pipeFds[0], buffer, sizeof buffer);
            if (n <= 0)
                break;
            if (exit.messages.size() < 65536)
                exit.messages.append(buffer, std::size_t(n));
        } else if (ready < 0 && errno != EINTR) {
            break;
        }
    }
    close(pipeFds[0]);
    int status = 0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    while (!exit.messages.empty() && (exit.messages.back() == '\n' || exit.messages.back() == '\r'))
        exit.messages.pop_back();
    if (WIFSIGNALED(status))
        exit.signal = WTERMSIG(status);
    else if (WIFEXITED(status))
        exit.exitCode = WEXITSTATUS(status);
    return exit;
}

}  // namespace kvscope
