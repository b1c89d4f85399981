#pragma once
// kvscope's executables find each other: beside the running executable (the build tree), or
// in ../lib/kvscope/ from it (the installed layout: /usr/bin/kvscope, /usr/lib/kvscope/...).

#include <string>

namespace kvscope {

// The executable `name`: $`overrideVariable` when set, else beside the running executable,
// else ../lib/kvscope/NAME from it (the path beside it when neither exists: its exec fails).
std::string siblingExecutable(const std::string& name, const char* overrideVariable);

}  // namespace kvscope
