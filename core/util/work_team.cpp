#include "util/work_team.h"

#include <algorithm>
#include <utility>

namespace kvscope {

WorkTeam::WorkTeam(int size)
{
    for (int member = 1; member < std::max(1, size); ++member)
        m_helpers.emplace_back([this, member] { helperLoop(member); });
}

WorkTeam::~WorkTeam()
{
    {
        std::lock_guard lock(m_mutex);
        m_stop = true;
    }
    m_wake.notify_all();
    for (std::thread& helper : m_helpers)
        helper.join();
}

void WorkTeam::run(int count, const std::function<void(int, int)>& task)
{
    std::unique_lock lock(m_mutex);
    m_task = &task;
    m_count = std::max(count, 0);
    m_nextIndex = 0;
    m_finished = 0;
    m_failure = nullptr;
    if (m_count > 1)
        m_wake.notify_all();
    while (m_nextIndex < m_count)
        runOne(lock, 0);
    m_done.wait(lock, [&] { return m_finished == m_count; });
    m_task = nullptr;
    m_count = m_nextIndex = m_finished = 0;
    if (m_failure)
        std::rethrow_exception(std::exchange(m_failure, nullptr));
}

void WorkTeam::runOne(std::unique_lock<std::mutex>& lock, int member)
{
    const int index = m_nextIndex++;
    const std::function<void(int, int)>& task = *m_task;
    lock.unlock();
    std::exception_ptr failure;
    try {
        task(index, member);
    } catch (...) {
        failure = std::current_exception();
    }
    lock.lock();
    ++m_finished;
    if (failure) {
        if (!m_failure)
            m_failure = failure;
        m_finished += m_count - m_nextIndex;  // the tasks not started are skipped
        m_nextIndex = m_count;
    }
    if (m_finished == m_count)
        m_done.notify_all();
}

void WorkTeam::post(std::function<void()> task)
{
    {
        std::lock_guard lock(m_mutex);
        m_posted.push_back(std::move(task));
    }
    m_wake.notify_one();
}

void WorkTeam::runPosted(std::unique_lock<std::mutex>& lock)
{
    std::function<void()> task = std::move(m_posted.front());
    m_posted.pop_front();
    ++m_postedRunning;
    lock.unlock();
    std::exception_ptr failure;
    try {
        task();
    } catch (...) {
        failure = std::current_exception();
    }
    lock.lock();
    if (failure && !m_postedFailure)
        m_postedFailure = failure;
    --m_postedRunning;
    m_done.notify_all();
}

void WorkTeam::waitPosted()
{
    std::unique_lock lock(m_mutex);
    while (!m_posted.empty())
        runPosted(lock);
    m_done.wait(lock, [&] { return m_postedRunning == 0; });
    if (m_postedFailure)
        std::rethrow_exception(std::exchange(m_postedFailure, nullptr));
}

void WorkTeam::helperLoop(int member)
{
    std::unique_lock lock(m_mutex);
    while (true) {
        m_wake.wait(lock, [&] { return m_stop || !m_posted.empty() || m_nextIndex < m_count; });
        if (m_stop)
            return;
        if (!m_posted.empty())
            runPosted(lock);
        else
            runOne(lock, member);
    }
}

}  // namespace kvscope
