#pragma once
// `kvscope import DIR -o BUNDLE.h5`: raw dumps (docs/import.md) made into a capture bundle.

#include <string>
#include <vector>

namespace kvscope::cli {

int importDumps(const std::vector<std::string>& args);

}  // namespace kvscope::cli
