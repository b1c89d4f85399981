#pragma once
// `kvscope bench`: the full three-way analysis of a synthetic Llama-3.3-70B-shaped capture
// against a memory-bandwidth roofline (reading and summing every input element once),
// measured in the same run, at the given layer count and twice that; each measurement runs
// in a child process so that its peak RSS is its own.

#include <string>
#include <vector>

namespace kvscope::cli {

int bench(const std::vector<std::string>& args);
// The child side: `kvscope bench-run roofline|analyze BUNDLE THREADS`.
int benchRun(const std::vector<std::string>& args);

}  // namespace kvscope::cli
