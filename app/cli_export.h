#pragma once
// `kvscope export BUNDLE OUT.h5 [--prompt ID]... [--layers SPEC]`: the reconstructed,
// merged and aligned KV, for scripts of one's own.

#include <string>
#include <vector>

namespace kvscope::cli {

int exportKv(const std::vector<std::string>& args);

}  // namespace kvscope::cli
