#include "qt_commands/app_commands.h"

namespace kvscope::cli {

RunCommand appCommand(const std::string& name)
{
    static const std::pair<const char*, RunCommand> table[] = {
        {"report", report},
        {"demo", demo},
    };
    for (const auto& [command, run] : table)
        if (name == command)
            return run;
    return nullptr;
}

}  // namespace kvscope::cli
