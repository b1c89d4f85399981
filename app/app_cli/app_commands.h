#pragma once
// kvscope-app's own commands: the ones that draw with Qt (the app's widgets make a report's
// images, the demo opens the window, bench times the app). Their usage is in the one command
// table (cli/commands.h); kvscope hands them here, and kvscope-app runs every other command
// itself too.

#include "cli/commands.h"

namespace kvscope::cli {

// The function of each command that cli/commands.h lists without one.
RunCommand appCommand(const std::string& name);

int report(const Args& args, std::ostream& out, std::ostream& err);
int demo(const Args& args, std::ostream& out, std::ostream& err);
int bench(const Args& args, std::ostream& out, std::ostream& err);
int benchRun(const Args& args, std::ostream& out, std::ostream& err);

}  // namespace kvscope::cli
