#pragma once
// `kvscope synth OUT.h5 [options]`: a capture from a small transformer run (core/synth).

#include <string>
#include <vector>

namespace kvscope::cli {

int synth(const std::vector<std::string>& args);

}  // namespace kvscope::cli
