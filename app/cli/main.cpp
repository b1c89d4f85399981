// kvscope: the headless commands (cli/commands.h), without Qt, so that they start in
// milliseconds; the app and the commands that draw run in kvscope-app (app_cli/main.cpp).

#include "cli/entry.h"

int main(int argc, char** argv)
{
    return kvscope::cli::runCommandLine(argc, argv, nullptr, kvscope::cli::execApp);
}
