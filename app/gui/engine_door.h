#pragma once
// The one way from the GUI to the engine. The controller's opening, every page's run (the
// heat map, the histograms, the what-if, a comparison), saving and the report all ask here: a
// request is tagged and runs off the GUI thread; a newer request of the same tag cancels the
// one running and replaces the one queued behind it (as RenderDoc's AsyncInvoke(tag)), so a
// burst of clicks runs the last one only. A request reports progress, can be cancelled, and
// hands its results to the GUI thread through its job; what a replaced request, or one whose
// receiver is gone, still hands over is dropped.

#include "gui/background_tasks.h"

#include <QObject>
#include <QPointer>
#include <QString>

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <optional>

namespace kvscope {

class EngineDoor;

// What a request's work gets, on its worker thread.
class EngineJob {
public:
    bool cancelled() const { return *m_cancel; }
    // For the engine's own options (AnalysisOptions::cancel and the like).
    const std::atomic<bool>* cancelFlag() const { return m_cancel.get(); }
    // `fn` runs on the GUI thread, unless a newer request of this tag came, the request was
    // dropped, or its receiver is gone.
    void deliver(std::function<void()> fn) const;
    // The door's progress() signal, under the same rule.
    void progress(int done, int total, const QString& what = {}) const;

private:
    friend class EngineDoor;
    EngineJob(EngineDoor* door, QString tag, int ticket, QPointer<QObject> receiver);
    EngineDoor* m_door;
    QString m_tag;
    int m_ticket;
    QPointer<QObject> m_receiver;
    std::shared_ptr<std::atomic<bool>> m_cancel = std::make_shared<std::atomic<bool>>(false);
};

class EngineDoor : public QObject {
    Q_OBJECT

public:
    using Work = std::function<void(EngineJob& job)>;

    explicit EngineDoor(QObject* owner);
    ~EngineDoor() override;  // cancels every request and waits for those running

    // Runs `work` under `tag` for `receiver` (what its deliveries touch): at once, or when the
    // running request of the tag, cancelled now, has returned.
    void ask(const QString& tag, QObject* receiver, Work work);
    // The running request sees cancelled() and still delivers (its "cancelled" among them); a
    // queued one is dropped.
    void cancel(const QString& tag);
    // Cancelled, and nothing it delivers from now on arrives.
    void drop(const QString& tag);
    // A request of the tag runs or waits.
    bool busy(const QString& tag) const;

signals:
    void progress(const QString& tag, int done, int total, const QString& what);

private:
    friend class EngineJob;
    struct Queued {
        QPointer<QObject> receiver;
        Work work;
    };
    struct Lane {
        int ticket = 0;  // the newest request's: deliveries of older ones are dropped
        std::shared_ptr<std::atomic<bool>> running;  // the running request's cancel flag, if any
        std::optional<Queued> queued;
    };
    void start(const QString& tag, Lane& lane, Queued request);
    void ended(const QString& tag);  // on the GUI thread, after a request's work returned
    bool isCurrent(const QString& tag, int ticket) const;

    std::map<QString, Lane> m_lanes;  // on the GUI thread only
    BackgroundTasks m_tasks;          // last: joined before the lanes go
};

}  // namespace kvscope
