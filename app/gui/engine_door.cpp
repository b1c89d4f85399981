#include "gui/engine_door.h"

#include <utility>

namespace kvscope {

EngineJob::EngineJob(EngineDoor* door, QString tag, int ticket, QPointer<QObject> receiver)
    : m_door(door)
    , m_tag(std::move(tag))
    , m_ticket(ticket)
    , m_receiver(std::move(receiver))
{
}

void EngineJob::deliver(std::function<void()> fn) const
{
    // (the check runs on the GUI thread, where the lanes and the receiver live)
    m_door->m_tasks.post([door = m_door, tag = m_tag, ticket = m_ticket, receiver = m_receiver, fn = std::move(fn)] {
        if (receiver && door->isCurrent(tag, ticket))
            fn();
    });
}

void EngineJob::progress(int done, int total, const QString& what) const
{
    deliver([door = m_door, tag = m_tag, done, total, what] { emit door->progress(tag, done, total, what); });
}

EngineDoor::EngineDoor(QObject* owner)
    : QObject(owner)
    , m_tasks(this)
{
}

EngineDoor::~EngineDoor()
{
    for (auto& [tag, lane] : m_lanes)
        if (lane.running)
            *lane.running = true;
    // m_tasks, the last member, goes first: it waits for every request.
}

void EngineDoor::ask(const QString& tag, QObject* receiver, Work work)
{
    Lane& lane = m_lanes[tag];
    ++lane.ticket;
    Queued request{receiver, std::move(work)};
    if (lane.running) {  // it stops at its next check; this one waits for it
        *lane.running = true;
        lane.queued = std::move(request);
        return;
    }
    start(tag, lane, std::move(request));
}

void EngineDoor::start(const QString& tag, Lane& lane, Queued request)
{
    auto job = std::make_shared<EngineJob>(EngineJob(this, tag, lane.ticket, request.receiver));
    lane.running = job->m_cancel;
    m_tasks.run([this, job, tag, work = std::move(request.work)] {
        work(*job);
        m_tasks.post([this, tag] { ended(tag); });  // after what the work delivered
    });
}

void EngineDoor::ended(const QString& tag)
{
    Lane& lane = m_lanes[tag];
    lane.running.reset();
    if (lane.queued)
        start(tag, lane, *std::exchange(lane.queued, std::nullopt));
}

void EngineDoor::cancel(const QString& tag)
{
    const auto it = m_lanes.find(tag);
    if (it == m_lanes.end())
        return;
    if (it->second.running)
        *it->second.running = true;
    it->second.queued.reset();
}

void EngineDoor::drop(const QString& tag)
{
    cancel(tag);
    ++m_lanes[tag].ticket;
}

bool EngineDoor::busy(const QString& tag) const
{
    const auto it = m_lanes.find(tag);
    return it != m_lanes.end() && (it->second.running || it->second.queued);
}

bool EngineDoor::isCurrent(const QString& tag, int ticket) const
{
    const auto it = m_lanes.find(tag);
    return it != m_lanes.end() && it->second.ticket == ticket;
}

}  // namespace kvscope
