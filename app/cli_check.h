#pragma once
// `kvscope check BUNDLE [--min-bc 0.9] [--max-ratio 2.0] [--max-linf X] [--json OUT]`:
// exit 0 within the thresholds, 1 with violations (listed), 2 on unreadable or invalid input.

#include <ostream>
#include <string>
#include <vector>

namespace kvscope::cli {

int check(const std::vector<std::string>& args, std::ostream& out, std::ostream& err);

}  // namespace kvscope::cli
