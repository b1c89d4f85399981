#include "gui/background_tasks.h"

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
    {
        const std::lock_guard lock(m_postedMutex);
        m_posted.push_back(std::move(fn));
    }
    // By name, not with a functor: no slot object is shared between the threads.
    QMetaObject::invokeMethod(this, "drain", Qt::QueuedConnection);
}

void BackgroundTasks::drain()
{
    for (;;) {
        std::function<void()> fn;
        {
            const std::lock_guard lock(m_postedMutex);
            if (m_posted.empty())
                return;
            fn = std::move(m_posted.front());
            m_posted.pop_front();
        }
        fn();
    }
}

}  // namespace kvscope
