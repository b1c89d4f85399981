#pragma once
// Work off the GUI thread, on plain std::threads that are joined when this object goes, with
// results handed back to the GUI thread through a queue of its own that the receiver drains.
// Not QtConcurrent, nor functors through Qt's event queue: Qt hands those over through its own
// futex locks, which ThreadSanitizer cannot see (Qt is not built with it), so every hand-off
// would read as a race; thread start, join and a std::mutex are what it sees.

#include <QObject>

#include <atomic>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace kvscope {

class BackgroundTasks : public QObject {
    Q_OBJECT

public:
    // Posted calls run on the thread of `owner` (which holds this object as a member).
    explicit BackgroundTasks(QObject* owner) { moveToThread(owner->thread()); }
    ~BackgroundTasks() override;  // waits for every task: they post to the owner
    BackgroundTasks(const BackgroundTasks&) = delete;
    BackgroundTasks& operator=(const BackgroundTasks&) = delete;

    void run(std::function<void()> work);
    // From a task: `fn` runs later on the receiver's thread.
    void post(std::function<void()> fn);

private slots:
    void drain();  // on the owner's thread: runs what the tasks posted

private:
    struct Task {
        std::thread thread;
        std::shared_ptr<std::atomic<bool>> done;
    };
    std::mutex m_mutex;
    std::vector<Task> m_tasks;
    std::mutex m_postedMutex;
    std::deque<std::function<void()>> m_posted;
};

}  // namespace kvscope
