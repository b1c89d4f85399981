#pragma once
// Work that must not share the caller's process (libtorch's import, the report's drawing from
// the app's window): another executable, in its own process group, killed with everything it
// started when the caller cancels. Its standard error is kept for the message it fails with.

#include <atomic>
#include <string>
#include <vector>

namespace kvscope {

struct ChildExit {
    bool cancelled = false;  // killed because `cancel` became true
    int signal = 0;          // it died of this signal (0: it exited)
    int exitCode = 0;
    std::string messages;    // its standard error, the first 64 KiB, trailing newlines cut
};

// Runs argv[0] with `argv` (standard output to /dev/null), polling `cancel` every 0.1 s.
// Throws std::runtime_error when it cannot be started.
ChildExit runChildProcess(const std::vector<std::string>& argv, const std::atomic<bool>* cancel = nullptr);

}  // namespace kvscope
