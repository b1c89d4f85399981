#pragma once
// The bar of a page's run on demand (the what-if, a comparison): its button, then a progress
// bar and Cancel while the run goes. The run goes through the controller's door under the
// page's tag; a new run replaces the one going, and Cancel drops it.

#include "gui/engine_door.h"

#include <QWidget>

#include <exception>
#include <functional>
#include <memory>

class QProgressBar;
class QPushButton;

namespace kvscope {

class RunBar : public QWidget {
    Q_OBJECT

public:
    RunBar(const QString& buttonText, EngineDoor& door, const QString& tag, QWidget* parent = nullptr);

    QPushButton* button() const { return m_button; }
    // Runs `compute` off the GUI thread, `total` steps (0: busy), reported with job.progress();
    // `finished` gets, on the GUI thread, what it returned, or null and why not.
    template <typename Result>
    void run(int total, std::function<std::shared_ptr<const Result>(const EngineJob&)> compute,
             std::function<void(std::shared_ptr<const Result>, const QString&)> finished);
    // Drops the run going, if any (nothing of it arrives); the button enabled as `canRun` says.
    void drop(bool canRun);

signals:
    void cancelledByUser();  // the Cancel button: the run was dropped

private:
    void begin(int total);
    void end(bool canRun);

    EngineDoor& m_door;
    QString m_tag;
    QPushButton* m_button;
    QProgressBar* m_progress;
    QPushButton* m_cancel;
};

template <typename Result>
void RunBar::run(int total, std::function<std::shared_ptr<const Result>(const EngineJob&)> compute,
                 std::function<void(std::shared_ptr<const Result>, const QString&)> finished)
{
    begin(total);
    m_door.ask(m_tag, this, [this, compute = std::move(compute), finished = std::move(finished)](EngineJob& job) {
        std::shared_ptr<const Result> result;
        QString error;
        try {
            result = compute(job);
        } catch (const std::exception& e) {
            error = QString::fromStdString(e.what());
        }
        if (job.cancelled())  // (replaced by a newer run: nothing of it arrives)
            return;
        job.deliver([this, finished, result, error] {
            end(true);
            finished(result, error);
        });
    });
}

}  // namespace kvscope
