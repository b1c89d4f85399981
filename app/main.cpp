// kvscope: the headless commands (app/cli/commands.h), without Qt, so that they start in
// milliseconds; the app and the commands that draw run in kvscope-app (app_main.cpp).

#include "cli/entry.h"

int main(int argc, char** argv)
{
    return kvscope::cli::runCommandLine(argc, argv, kvscope::cli::execApp);
}
