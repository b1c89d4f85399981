#include "gui/run_bar.h"

#include <QKeySequence>

#include <QHBoxLayout>
#include <QProgressBar>
#include <QPushButton>

namespace kvscope {

RunBar::RunBar(const QString& buttonText, EngineDoor& door, const QString& tag, QWidget* parent)
    : QWidget(parent)
    , m_door(door)
    , m_tag(tag)
    , m_button(new QPushButton(buttonText))
    , m_progress(new QProgressBar)
    , m_cancel(new QPushButton(tr("Cancel")))
{
    auto* layout = new QHBoxLayout(this);
    layout->setContentsMargins(0, 0, 0, 0);
    layout->addWidget(m_button);
    // (a hidden page's button takes no shortcut: each page's Ctrl+Enter is its own)
    m_button->setShortcut(QKeySequence(Qt::CTRL | Qt::Key_Return));
    m_button->setToolTip(tr("%1 (Ctrl+Enter)").arg(QString(buttonText).remove('&')));
    layout->addWidget(m_progress, 1);
    layout->addWidget(m_cancel);
    m_progress->hide();
    m_cancel->hide();
    connect(m_cancel, &QPushButton::clicked, this, [this] {
        drop(true);
        emit cancelledByUser();
    });
    connect(&m_door, &EngineDoor::progress, this, [this](const QString& tag, int done, int total) {
        if (tag == m_tag) {
            m_progress->setRange(0, total);
            m_progress->setValue(done);
        }
    });
}

void RunBar::begin(int total)
{
    m_button->setEnabled(false);
    m_progress->setRange(0, total);
    m_progress->setValue(0);
    m_progress->show();
    m_cancel->show();
}

void RunBar::end(bool canRun)
{
    m_cancel->hide();
    m_progress->hide();
    m_button->setEnabled(canRun);
}

void RunBar::drop(bool canRun)
{
    m_door.drop(m_tag);
    end(canRun);
}

}  // namespace kvscope
