#pragma once
// The command line: one table of every command (name, usage, what it does), read by main, by
// `kvscope --help` and by `kvscope COMMAND --help`. Every command takes its arguments (after
// the command name) and two streams, and returns the process exit code: 0 done, 1 done with
// findings (check, inspect), 2 bad arguments or unreadable input.
//
// The commands in this folder need no Qt and run in every executable. The ones that draw
// with Qt (report, demo) are kvscope-app's own (app/qt_commands/app_commands.h), and bench is
// kvscope-bench's (tools/bench/): in this table they have no function, and kvscope hands them
// to that executable (commands/entry.h).

#include "analysis/analysis_share.h"
#include "analysis/threshold_check.h"
#include "kv/sweep.h"
#include "commands/option_parser.h"

#include <iosfwd>
#include <string>
#include <vector>

namespace kvscope::cli {

using RunCommand = int (*)(const Args& args, std::ostream& out, std::ostream& err);

struct Command {
    const char* name;
    const char* usage;    // the synopsis and its options, without "usage: kvscope "
    const char* summary;  // one line for `kvscope --help`
    RunCommand run;       // null: run by the sibling executable below
    bool listed = true;   // false: internal (bench's child processes)
    // Where a command without `run` runs: kvscope-app (drawn with Qt), or kvscope-bench (the
    // benchmark, a tool of its own: tools/bench/).
    const char* executable = "kvscope-app";
};

const std::vector<Command>& commands();
const Command* findCommand(const std::string& name);
// "usage: kvscope NAME ..." of one command.
void printUsage(const std::string& name, std::ostream& out);
// The overview: every listed command with its one line.
void printOverview(std::ostream& out);

// --min-bc, --seed-bc, --max-ratio, --max-linf, --suspect-floor, --suspect-drift-two-way, for check and report.
void addThresholdOptions(OptionParser& parser, Thresholds& thresholds);
// --suspect-floor, --suspect-drift-two-way alone, for analyze (a results file records them).
void addSuspectOptions(OptionParser& parser, SuspectThresholds& suspects);

// The share of every analysis this process runs with others (kvscope-mpi sets it; null in
// kvscope): analyze, check and report analyse with it (analysis/analysis_share.h).
AnalysisShare* sharedAnalysis();
void setSharedAnalysis(AnalysisShare* share);
// What is done with each bundle of a sweep before it is opened (kv/sweep.h): its metadata read in
// a child process (BundleReader::probeInChild) by default; kvscope-mpi probes before MPI starts
// and sets a lookup of those probes instead.
const BundleProbe& bundleProbe();
void setBundleProbe(BundleProbe probe);

// The commands without Qt, one file each in this folder.
int analyze(const Args& args, std::ostream& out, std::ostream& err);
int check(const Args& args, std::ostream& out, std::ostream& err);
int diff(const Args& args, std::ostream& out, std::ostream& err);
int inspect(const Args& args, std::ostream& out, std::ostream& err);
int importDumps(const Args& args, std::ostream& out, std::ostream& err);
int exportKv(const Args& args, std::ostream& out, std::ostream& err);
int synth(const Args& args, std::ostream& out, std::ostream& err);
int transfer(const Args& args, std::ostream& out, std::ostream& err);
int whatif(const Args& args, std::ostream& out, std::ostream& err);

}  // namespace kvscope::cli
