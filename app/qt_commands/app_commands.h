#pragma once
// kvscope-app's own commands: the ones that draw with Qt (the app's widgets make a report's
// images, the demo opens the window). Their usage is in the one command table
// (commands/commands.h); kvscope hands them here, and kvscope-app runs every other command
// itself too.

#include "commands/commands.h"

namespace kvscope::cli {

// The function of each command that commands/commands.h lists without one (kvscope-app's).
RunCommand appCommand(const std::string& name);

int report(const Args& args, std::ostream& out, std::ostream& err);
int demo(const Args& args, std::ostream& out, std::ostream& err);

}  // namespace kvscope::cli
