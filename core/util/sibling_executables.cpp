#include "util/sibling_executables.h"

#include <cstdlib>
#include <filesystem>

namespace kvscope {

std::string siblingExecutable(const std::string& name, const char* overrideVariable)
{
    if (const char* forced = std::getenv(overrideVariable); forced && *forced)
        return forced;
    std::error_code error;
    const std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe", error);
    if (error)
        return name;
    for (const std::filesystem::path& candidate :
         {self.parent_path() / name, self.parent_path().parent_path() / "lib" / "kvscope" / name})
        if (std::filesystem::exists(candidate, error))
            return candidate.string();
    return (self.parent_path() / name).string();
}

}  // namespace kvscope
