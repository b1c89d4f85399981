#include "gui/background_tasks.h"

#include "util/tsan_annotations.h"

#include <QMetaObject>

namespace kvscope {

BackgroundTasks::~BackgroundTasks()
{
    const std::lock_guard lock(m_mutex);
    for (Task& task : m_tasks)
        task.thread.join();
}

void BackgroundTasks::run(std::function<void()> work)
{
    const std::lock_guard lock(m_mutex);
    // Finished tasks are joined here, so that threads do not pile up.
    std::erase_if(m_tasks, [](Task& task) {
        if (!*task.done)
            return false;
        task.thread.join();
        return true;
    });
    auto done = std::make_shared<std::atomic<bool>>(false);
    m_tasks.push_back({std::thread([work = std::move(work), done] {
                           work();
                           *done = true;
                       }),
                       done});
}

void BackgroundTasks::post(std::function<void()> fn)
{
    kvscopeRelease(this);
    QMetaObject::invokeMethod(
        m_receiver, [this, fn = std::move(fn)] {
            kvscopeAcquire(this);
            fn();
        },
        Qt::QueuedConnection);
}

}  // namespace kvscope
