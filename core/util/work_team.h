#pragma once
// A fixed team of threads that runs numbered tasks together with the calling thread: fork and
// join without starting a thread per loop (the analysis runs a few such loops a layer), tasks
// handed out as threads come free, and other work (reading the next layer) posted to run
// alongside the next loop, so that no thread waits while another has work.

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace kvscope {

class WorkTeam {
public:
    // `size` threads in all: the caller of run() and size - 1 helpers.
    explicit WorkTeam(int size);
    ~WorkTeam();
    WorkTeam(const WorkTeam&) = delete;
    WorkTeam& operator=(const WorkTeam&) = delete;

    int size() const { return int(m_helpers.size()) + 1; }

    // Runs task(index, member) for every index in [0, count), each once, and returns when all
    // have run. `member` (0 for the caller, below size()) names the thread running it, for
    // per-thread scratch: no two tasks with the same member run at once. After a task throws,
    // the tasks not yet started are skipped, and run() rethrows the first exception.
    void run(int count, const std::function<void(int index, int member)>& task);
    // Runs `task` in the next run() (with count 0 too), handed out before that run's own tasks;
    // run() returns when it is done as well. From the thread that calls run(), between runs.
    void post(std::function<void()> task);

private:
    void helperLoop(int member);
    void work(int member);

    std::vector<std::thread> m_helpers;
    std::mutex m_mutex;
    std::condition_variable m_wake;
    std::condition_variable m_done;
    const std::function<void(int, int)>* m_task = nullptr;
    int m_count = 0;
    std::vector<std::function<void()>> m_posted;
    std::atomic<int> m_next{0};  // counts the posted tasks, then the run's own
    int m_busy = 0;  // helpers not yet through the current run
    std::uint64_t m_generation = 0;
    bool m_stop = false;
    std::exception_ptr m_failure;
};

}  // namespace kvscope
