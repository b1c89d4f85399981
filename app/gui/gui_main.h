#pragma once
// Starting the desktop app.

#include <QString>

#include <string>
#include <vector>

namespace kvscope {

struct GuiLaunch {
    QString path;        // a bundle or a folder of dumps to open, or empty
    QString screenshot;  // when set: once the analysis is done, save the window here and quit
    bool acrossPrompts = false;  // with screenshot: show the across-prompts page
    // When set: a child process that makes `path` first (the demo's capture), `making` saying
    // so while the window is already up (AnalysisController::openMade).
    std::vector<std::string> makeArgv;
    QString making;
};

int runGui(int argc, char** argv, const GuiLaunch& launch);

}  // namespace kvscope
