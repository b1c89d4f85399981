#pragma once
// Starting the desktop app.

#include <QString>

namespace kvscope {

struct GuiLaunch {
    QString path;        // a bundle or a folder of dumps to open, or empty
    QString screenshot;  // when set: once the analysis is done, save the window here and quit
    bool acrossPrompts = false;  // with screenshot: show the across-prompts page
};

int runGui(int argc, char** argv, const GuiLaunch& launch);

}  // namespace kvscope
