#include "gui/run_bar.h"

#include <QHBoxLayout>
#include <QProgressBar>
#include <QPushButton>

namespace kvscope {

RunBar::RunBar(const QString& buttonText, QWidget* parent)
    : QWidget(parent)
    , m_button(new QPushButton(buttonText))
    , m_progress(new QProgressBar)
    , m_cancel(new QPushButton(tr("Cancel")))
{
    auto* layout = new QHBoxLayout(this);
    layout->setContentsMargins(0, 0, 0, 0);
    layout->addWidget(m_button);
    layout->addWidget(m_progress, 1);
    layout->addWidget(m_cancel);
    m_progress->hide();
    m_cancel->hide();
    connect(m_cancel, &QPushButton::clicked, this, [this] {
        cancel(true);
        emit cancelledByUser();
    });
}

RunBar::~RunBar()
{
    if (m_flag)
        m_flag->store(true);
}

std::shared_ptr<std::atomic<bool>> RunBar::begin(int total)
{
    cancel(false);
    m_flag = std::make_shared<std::atomic<bool>>(false);
    m_button->setEnabled(false);
    m_progress->setRange(0, total);
    m_progress->setValue(0);
    m_progress->show();
    m_cancel->show();
    return m_flag;
}

void RunBar::setProgress(int done, int total)
{
    m_progress->setRange(0, total);
    m_progress->setValue(done);
}

void RunBar::end(bool canRun)
{
    m_cancel->hide();
    m_progress->hide();
    m_button->setEnabled(canRun);
}

void RunBar::cancel(bool canRun)
{
    if (m_flag)
        m_flag->store(true);
    ++m_generation;
    end(canRun);
}

}  // namespace kvscope
