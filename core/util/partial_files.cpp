#include "util/partial_files.h"

#include <array>
#include <atomic>
#include <csignal>
#include <cstring>
#include <mutex>

#include <unistd.h>

namespace kvscope {

namespace {

// Fixed slots, so that the signal handler touches no allocator and takes no lock: unlink()
// and a lock-free flag are all it uses.
struct Slot {
    std::atomic<bool> used{false};
    char path[4096] = {};
};
std::array<Slot, 16> slots;
std::mutex slotsMutex;  // between threads that register; the handler does not take it

extern "C" void removeAndDie(int signal)
{
    for (Slot& slot : slots)
        if (slot.used.load())
            ::unlink(slot.path);
    std::signal(signal, SIG_DFL);
    std::raise(signal);
}

}  // namespace

void registerPartialFile(const std::string& path)
{
    if (path.size() >= sizeof(Slot::path))
        return;  // such a path cannot be removed for us; the file is left as it would be without this
    const std::lock_guard lock(slotsMutex);
    for (Slot& slot : slots)
        if (!slot.used.load()) {
            std::memcpy(slot.path, path.c_str(), path.size() + 1);
            slot.used.store(true);
            return;
        }
}

void unregisterPartialFile(const std::string& path)
{
    const std::lock_guard lock(slotsMutex);
    for (Slot& slot : slots)
        if (slot.used.load() && path == slot.path) {
            slot.used.store(false);
            return;
        }
}

void removePartialFilesOnTermination()
{
    for (int signal : {SIGINT, SIGTERM, SIGHUP}) {
        struct sigaction current = {};
        if (sigaction(signal, nullptr, &current) == 0 && current.sa_handler == SIG_IGN)
            continue;  // ignored on purpose (nohup, a shell's background job): it stays so
        struct sigaction remove = {};
        remove.sa_handler = removeAndDie;
        sigaction(signal, &remove, nullptr);
    }
}

}  // namespace kvscope
