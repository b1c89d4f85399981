// kvscope: the headless commands (commands/commands.h), without Qt, so that they start in
// milliseconds; the app and the commands that draw run in kvscope-app (qt_commands/main.cpp).

#include "commands/entry.h"

int main(int argc, char** argv)
{
    return kvscope::cli::runCommandLine(argc, argv, nullptr, kvscope::cli::execApp);
}
