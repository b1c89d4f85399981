#pragma once
// `kvscope report BUNDLE -o DIR [--min-bc 0.9] [--max-ratio 2.0] [--max-linf X]`

#include <string>
#include <vector>

namespace kvscope::cli {

// Needs a QApplication (main makes an offscreen one).
int report(const std::vector<std::string>& args);

}  // namespace kvscope::cli
