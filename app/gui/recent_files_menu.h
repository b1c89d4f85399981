#pragma once
// File > Open recent: the last ten bundles opened, kept in QSettings.

#include <QMenu>

namespace kvscope {

class RecentFilesMenu : public QMenu {
    Q_OBJECT

public:
    explicit RecentFilesMenu(QWidget* parent = nullptr);
    void add(const QString& path);
    void remove(const QString& path);  // e.g. it failed to open

signals:
    void openRequested(const QString& path);

private:
    void rebuild();
};

}  // namespace kvscope
