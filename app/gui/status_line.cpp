#include "gui/status_line.h"

#include "gui/analysis_controller.h"

#include <QFileInfo>
#include <QLabel>
#include <QProgressBar>
#include <QPushButton>
#include <QStatusBar>

namespace kvscope {

StatusLine::StatusLine(AnalysisController* controller, QStatusBar* bar)
    : QObject(bar)
    , m_controller(controller)
    , m_text(new QLabel(tr("Open a capture bundle (File > Open, or drop it here)")))
    , m_progress(new QProgressBar)
    , m_cancel(new QPushButton(tr("Cancel")))
{
    m_progress->setMaximumWidth(240);
    m_text->setMinimumWidth(1);  // a long message must not widen the window: it is cut, whole in the tooltip
    bar->addWidget(m_text, 1);
    bar->addPermanentWidget(m_progress);
    bar->addPermanentWidget(m_cancel);
    stopProgress();
    connect(m_cancel, &QPushButton::clicked, controller, &AnalysisController::cancel);
    connect(controller, &AnalysisController::progress, this, &StatusLine::showProgress);
}

void StatusLine::setText(const QString& text)
{
    // One line; all of it in the tooltip (the error of a file can be long).
    m_text->setText(text.section('\n', 0, 0));
    m_text->setToolTip(text);
}

void StatusLine::showMessage(const QString& text)
{
    setText(text);
}

void StatusLine::showSummary()
{
    if (!m_controller->isRunning() && !m_summary.isEmpty())
        setText(m_summary);
}

void StatusLine::showProgress(int done, int total, const QString& what)
{
    m_progress->setRange(0, total);
    m_progress->setValue(done);
    setText(total ? tr("%1: %2 of %3 layers").arg(what).arg(done).arg(total) : what);
}

void StatusLine::stopProgress()
{
    m_progress->hide();
    m_cancel->hide();
}

void StatusLine::captureOpening(const QString& path, bool kept)
{
    setText(tr("opening %1").arg(path));
    m_progress->setRange(0, 0);
    m_progress->show();
    m_cancel->show();
    if (!kept)
        m_summary.clear();
}

void StatusLine::captureAnalysed()
{
    stopProgress();
    const auto result = m_controller->result();
    m_summary = tr("%1: %2 prompt(s), %3 layers analysed")
                    .arg(QFileInfo(m_controller->path()).fileName())
                    .arg(result->prompts.size())
                    .arg(result->prompts.empty() ? 0 : result->prompts.front().layers.size());
    // A results file without its bundle: what needs the KV is off, and this says why.
    if (const QString missing = m_controller->bundleMissing(); !missing.isEmpty())
        m_summary += tr(" (from results; %1: views that need the KV are off)").arg(missing);
    setText(m_summary);
}

void StatusLine::bundleLocated()
{
    captureAnalysed();
    if (const QString missing = m_controller->bundleMissing(); !missing.isEmpty())
        setText(tr("not that bundle: %1").arg(missing));
    else
        setText(tr("%1 found: every view is on").arg(QString::fromStdString(m_controller->loader()->path())));
}

void StatusLine::analysisCancelled()
{
    stopProgress();
    setText(tr("analysis cancelled: the layers done so far are shown"));
}

void StatusLine::openingStopped(const QString& path, const QString& error)
{
    stopProgress();
    const QString shown = QFileInfo(m_controller->path()).fileName();
    setText(error.isEmpty() ? tr("opening %1 cancelled; still showing %2").arg(QFileInfo(path).fileName(), shown)
                                    : tr("could not open %1; still showing %2").arg(QFileInfo(path).fileName(), shown));
}

void StatusLine::captureClosed(const QString& why)
{
    stopProgress();
    m_summary.clear();
    setText(why);
}

}  // namespace kvscope
