#pragma once
// kvscope bench: the analysis, the app and the commands timed against what they must read, on
// captures shaped like what users have (README, docs/performance.md). A tool of its own
// (kvscope-bench, which kvscope runs for `kvscope bench`), not part of the product: it drives
// the app's window and pages to time them.

#include "commands/commands.h"

namespace kvscope::cli {

int bench(const Args& args, std::ostream& out, std::ostream& err);
// One measurement, in a process of its own (bench runs `kvscope bench-run ...`).
int benchRun(const Args& args, std::ostream& out, std::ostream& err);
// bench and bench-run: kvscope-bench's own commands.
RunCommand benchCommand(const std::string& name);

}  // namespace kvscope::cli
