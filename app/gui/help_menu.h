#pragma once
// The Help menu: the keyboard shortcuts, the documentation the error messages cite (installed
// or in the source tree), and the version.

#include <QMenu>

namespace kvscope {

class HelpMenu : public QMenu {
    Q_OBJECT

public:
    explicit HelpMenu(QWidget* parent = nullptr);
    // The folder of docs/*.md: installed beside the executable's prefix, else the source tree's.
    static QString docsFolder();
    static QString shortcutsText();
};

}  // namespace kvscope
