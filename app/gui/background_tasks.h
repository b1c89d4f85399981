#pragma once
// Work off the GUI thread, on plain std::threads that are joined when this object goes, with
// results handed back to the GUI thread through the receiver's event queue. Not QtConcurrent:
// Qt's thread pool hands tasks over through its own futex locks, which ThreadSanitizer cannot
// see (Qt is not built with it), so every hand-off would read as a race; thread start and join
// are pthread calls it sees, and the queue hand-off is annotated (util/tsan_annotations.h).

#include <QObject>

#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace kvscope {

class BackgroundTasks {
public:
    // `receiver` (which owns this object) gets the posted calls on its thread.
    explicit BackgroundTasks(QObject* receiver) : m_receiver(receiver) {}
    ~BackgroundTasks();  // waits for every task: they post to the receiver
    BackgroundTasks(const BackgroundTasks&) = delete;
    BackgroundTasks& operator=(const BackgroundTasks&) = delete;

    void run(std::function<void()> work);
    // From a task: `fn` runs later on the receiver's thread.
    void post(std::function<void()> fn);

private:
    struct Task {
        std::thread thread;
        std::shared_ptr<std::atomic<bool>> done;
    };
    QObject* m_receiver;
    std::mutex m_mutex;
    std::vector<Task> m_tasks;
};

}  // namespace kvscope
