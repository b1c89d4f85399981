#pragma once
// A fixed team of threads that runs numbered tasks together with the calling thread: fork and
// join without starting a thread per loop (the analysis runs a few such loops a layer), tasks
// handed out as threads come free, and other work (reading the next layer) posted to run on a
// helper across those loops, so that no thread waits while another has work.

#include <condition_variable>
#include <deque>
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

    // Posted work is taken by the first helper free (before any run's tasks), and runs beside
    // the runs that follow; waitPosted() returns when all of it is done (doing what no helper
    // took itself) and rethrows the first exception it threw. From the caller's thread.
    void post(std::function<void()> task);
    void waitPosted();

private:
    void helperLoop(int member);
    // Runs the current run's next task; `lock` is held on entry and exit, not while it runs.
    void runOne(std::unique_lock<std::mutex>& lock, int member);
    void runPosted(std::unique_lock<std::mutex>& lock);

    std::vector<std::thread> m_helpers;
    std::mutex m_mutex;
    std::condition_variable m_wake;  // work for helpers, or stop
    std::condition_variable m_done;  // a run's last task, or posted work, finished
    const std::function<void(int, int)>* m_task = nullptr;
    int m_count = 0;
    int m_nextIndex = 0;
    int m_finished = 0;
    std::exception_ptr m_failure;
    std::deque<std::function<void()>> m_posted;
    int m_postedRunning = 0;
    std::exception_ptr m_postedFailure;
    bool m_stop = false;
};

}  // namespace kvscope
