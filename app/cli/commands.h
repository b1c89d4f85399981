#pragma once
// The command line: one table of commands (name, usage, what it does, the function), read by
// main, by `kvscope --help` and by `kvscope COMMAND --help`. Every command takes its
// arguments (after the command name) and two streams, and returns the process exit code:
// 0 done, 1 done with findings (check, inspect), 2 bad arguments or unreadable input.

#include "analysis/threshold_check.h"

#include <iosfwd>
#include <string>
#include <vector>

namespace kvscope::cli {

using Args = std::vector<std::string>;

struct Command {
    const char* name;
    const char* usage;    // the synopsis and its options, without "usage: kvscope "
    const char* summary;  // one line for `kvscope --help`
    int (*run)(const Args& args, std::ostream& out, std::ostream& err);  // null: in kvscope-app
    bool listed = true;   // false: internal (bench's child processes)
};

const std::vector<Command>& commands();
const Command* findCommand(const std::string& name);
// "usage: kvscope NAME ..." of one command.
void printUsage(const std::string& name, std::ostream& out);
// The overview: every listed command with its one line.
void printOverview(std::ostream& out);

// --min-bc, --seed-bc, --max-ratio, --max-linf, --suspect-floor[-two-way] at args[i] (with its value; i moves past it), for check
// and report. False when args[i] is not one of them; throws std::invalid_argument on a bad value.
bool takeThresholdOption(const Args& args, std::size_t& i, Thresholds& thresholds);

// The commands, one file each in app/cli/.
int analyze(const Args& args, std::ostream& out, std::ostream& err);
int check(const Args& args, std::ostream& out, std::ostream& err);
int inspect(const Args& args, std::ostream& out, std::ostream& err);
int importDumps(const Args& args, std::ostream& out, std::ostream& err);
int exportKv(const Args& args, std::ostream& out, std::ostream& err);
int synth(const Args& args, std::ostream& out, std::ostream& err);
// The commands that draw with Qt, linked into kvscope-app only. Weak: in kvscope they are
// null, and the command line hands them to kvscope-app (cli/entry.h).
[[gnu::weak]] int report(const Args& args, std::ostream& out, std::ostream& err);
[[gnu::weak]] int demo(const Args& args, std::ostream& out, std::ostream& err);
[[gnu::weak]] int bench(const Args& args, std::ostream& out, std::ostream& err);
[[gnu::weak]] int benchRun(const Args& args, std::ostream& out, std::ostream& err);

}  // namespace kvscope::cli
