#pragma once
// The window's status bar: what is open (or opening, or why not), the analysis's progress and
// its Cancel. A viewer of the open capture; other parts say a passing message through it.

#include "gui/capture_viewer.h"

#include <QObject>
#include <QString>

class QLabel;
class QProgressBar;
class QPushButton;
class QStatusBar;

namespace kvscope {

class AnalysisController;

class StatusLine : public QObject, public CaptureViewer {
    Q_OBJECT

public:
    StatusLine(AnalysisController* controller, QStatusBar* bar);

    // Until the next event of the capture, or showSummary().
    void showMessage(const QString& text);
    // Back to what is open (a message about a cell goes stale with the cell).
    void showSummary();
    QString summary() const { return m_summary; }

    void captureOpening(const QString& path, bool kept) override;
    void captureOpened() override { m_summary.clear(); }  // until it is analysed
    void captureAnalysed() override;
    void analysisCancelled() override;
    void openingStopped(const QString& path, const QString& error) override;
    void captureClosed(const QString& why) override;
    // After File > Locate bundle...: the summary again, or why that file is not the bundle.
    void bundleLocated();

private:
    void setText(const QString& text);
    void showProgress(int done, int total, const QString& what);
    void stopProgress();

    AnalysisController* m_controller;
    QLabel* m_text;
    QProgressBar* m_progress;
    QPushButton* m_cancel;
    QString m_summary;  // what is open
};

}  // namespace kvscope
