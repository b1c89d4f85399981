// kvscope-bench: `kvscope bench` and its measurements (`bench-run`), with every other command of
// commands/ too (kvscope runs it for those two; tools/bench/bench.h).

#include "bench/bench.h"
#include "commands/entry.h"

#include <iostream>

namespace {

int notACommand(int, char**)
{
    std::cerr << "kvscope-bench runs `bench` and `bench-run` (kvscope bench --help)\n";
    return 2;
}

}  // namespace

int main(int argc, char** argv)
{
    return kvscope::cli::runCommandLine(argc, argv, kvscope::cli::benchCommand, notACommand);
}
