#include "gui/recent_files_menu.h"

#include <QSettings>

namespace kvscope {

namespace {

constexpr int kRemembered = 10;
const char* const kKey = "recentFiles";

}  // namespace

RecentFilesMenu::RecentFilesMenu(QWidget* parent)
    : QMenu(tr("Open &recent"), parent)
{
    rebuild();
}

void RecentFilesMenu::add(const QString& path)
{
    QSettings settings;
    QStringList recent = settings.value(kKey).toStringList();
    recent.removeAll(path);
    recent.prepend(path);
    while (recent.size() > kRemembered)
        recent.removeLast();
    settings.setValue(kKey, recent);
    rebuild();
}

void RecentFilesMenu::remove(const QString& path)
{
    QSettings settings;
    QStringList recent = settings.value(kKey).toStringList();
    recent.removeAll(path);
    settings.setValue(kKey, recent);
    rebuild();
}

void RecentFilesMenu::rebuild()
{
    clear();
    const QStringList recent = QSettings().value(kKey).toStringList();
    for (const QString& path : recent)
        addAction(path, this, [this, path] { emit openRequested(path); });
    setEnabled(!recent.isEmpty());
}

}  // namespace kvscope
