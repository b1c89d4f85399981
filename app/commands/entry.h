#pragma once
// What the executables do with their command line: kvscope (the commands without Qt),
// kvscope-app (the app, and the commands that draw: report, demo) and kvscope-bench. A command runs
// where it is linked; the rest of the command line (a bundle to open, or nothing) is the app.

#include "commands/commands.h"

namespace kvscope::cli {

// Runs the command named by argv[1], or calls `openApp` (the app on argv[1], or on nothing).
// The commands the table lists without a function are looked up in `appCommand` (kvscope-app's
// own, qt_commands/app_commands.h); without it (kvscope), they run in their sibling executable.
int runCommandLine(int argc, char** argv, RunCommand (*appCommand)(const std::string& name),
                   int (*openApp)(int argc, char** argv));

// kvscope's side: runs the sibling `executable` (kvscope-app, kvscope-bench) with this command
// line instead of the running process (it returns only when that fails). $KVSCOPE_CLI tells it
// where kvscope is.
int execSibling(const std::string& executable, int argc, char** argv);
// The app: execSibling("kvscope-app", ...).
int execApp(int argc, char** argv);

}  // namespace kvscope::cli
