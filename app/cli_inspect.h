#pragma once
// `kvscope inspect BUNDLE`: what a bundle holds, and whether every layer reconstructs.

#include <ostream>
#include <string>

namespace kvscope::cli {

// Returns the process exit code: 0 when every prompt and layer reconstructs, 1 when some
// do not (each problem is printed), 2 when the file cannot be read as a bundle at all.
int inspect(const std::string& path, std::ostream& out, std::ostream& err);

}  // namespace kvscope::cli
