#pragma once
// The bar of a page's run on demand (the what-if, a comparison): its button, then a progress
// bar and Cancel while the run goes. It keeps the run's cancel flag and a generation, so that
// the page drops what an older (cancelled or replaced) run reports.

#include <QWidget>

#include <atomic>
#include <memory>

class QProgressBar;
class QPushButton;

namespace kvscope {

class RunBar : public QWidget {
    Q_OBJECT

public:
    explicit RunBar(const QString& buttonText, QWidget* parent = nullptr);
    ~RunBar() override;  // a run still going is cancelled

    QPushButton* button() const { return m_button; }
    // A new run (an older one is cancelled): its cancel flag; `total` steps, 0 for busy.
    std::shared_ptr<std::atomic<bool>> begin(int total);
    int generation() const { return m_generation; }
    bool isCurrent(int generation) const { return generation == m_generation; }
    void setProgress(int done, int total);
    // The current run ended: the button back, enabled as `canRun` says.
    void end(bool canRun);
    // Cancels the current run, if any; its results are dropped.
    void cancel(bool canRun);

signals:
    void cancelledByUser();  // the Cancel button

private:
    QPushButton* m_button;
    QProgressBar* m_progress;
    QPushButton* m_cancel;
    std::shared_ptr<std::atomic<bool>> m_flag;
    int m_generation = 0;
};

}  // namespace kvscope
