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

void WorkTeam::post(std::function<void()> task)
{
    m_posted.push_back(std::move(task));
}

void WorkTeam::run(int count, const std::function<void(int, int)>& task)
{
    count = std::max(count, 0);
    const std::size_t tasks = std::size_t(count) + m_posted.size();
    if (tasks == 0)
        return;
    if (m_helpers.empty() || tasks == 1) {
        const std::vector<std::function<void()>> posted = std::exchange(m_posted, {});
        for (const auto& p : posted)
            p();
        for (int i = 0; i < count; ++i)
            task(i, 0);
        return;
    }
    {
        std::lock_guard lock(m_mutex);
        m_task = &task;
        m_count = count;
        m_next = 0;
        m_busy = int(m_helpers.size());
        m_failure = nullptr;
        ++m_generation;
    }
    m_wake.notify_all();
    work(0);
    std::unique_lock lock(m_mutex);
    m_done.wait(lock, [&] { return m_busy == 0; });
    m_task = nullptr;
    m_posted.clear();
    if (m_failure)
        std::rethrow_exception(std::exchange(m_failure, nullptr));
}

void WorkTeam::work(int member)
{
    const int posted = int(m_posted.size());
    for (int i; (i = m_next++) < posted + m_count;) {
        try {
            if (i < posted)
                m_posted[std::size_t(i)]();
            else
                (*m_task)(i - posted, member);
        } catch (...) {
            std::lock_guard lock(m_mutex);
            if (!m_failure)
                m_failure = std::current_exception();
            m_next = posted + m_count;  // start no more
        }
    }
}

void WorkTeam::helperLoop(int member)
{
    std::uint64_t seen = 0;
    while (true) {
        {
            std::unique_lock lock(m_mutex);
            m_wake.wait(lock, [&] { return m_stop || m_generation != seen; });
            if (m_stop)
                return;
            seen = m_generation;
        }
        work(member);
        std::lock_guard lock(m_mutex);
        if (--m_busy == 0)
            m_done.notify_one();
    }
}

}  // namespace kvscope
