// kvscope-mpi: kvscope's commands in an MPI job (mpirun, Slurm's srun, a Kubernetes MPIJob).
// analyze, check and report share the prompts of their bundles out over the ranks, pool them
// exactly (the JSON is byte for byte kvscope's) and write on rank 0; every other command (and
// these on a results file, or report --against) runs on rank 0 alone. Only this executable
// links MPI (docs/scale-out.md).

#include "qt_commands/app_commands.h"
#include "commands/commands.h"
#include "format/bundle_error.h"
#include "format/bundle_reader.h"
#include "kv/sweep.h"
#include "mpi/mpi_share.h"
#include "results/results_file.h"
#include "util/version.h"

#include <mpi.h>

#include <cstdlib>
#include <filesystem>
#include <map>
#include <stdexcept>
#include <iostream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

namespace {

using namespace kvscope;
using namespace kvscope::cli;

// The commands whose analysis the ranks share.
const std::set<std::string> kShared{"analyze", "check", "report"};

// The bundles named on the command line (files, and folders' *.h5), each read first in a child
// process, as kvscope does (cli/crash_guard.h): a file that crashes libhdf5 is reported instead of
// ending the rank. Before MPI starts, where forking is safe on every interconnect. Per path that
// cannot be read: why.
std::map<std::string, BundleError> probeBundles(const std::vector<std::string>& args)
{
    std::map<std::string, BundleError> unreadable;
    for (std::size_t i = 1; i < args.size(); ++i) {
        if (args[i].starts_with("-"))
            continue;
        std::vector<std::string> paths;
        try {
            paths = sweepBundlePaths({args[i]});
        } catch (const BundleError&) {
            continue;  // not a bundle or folder (an option's value): the command says what it is
        }
        for (const std::string& path : paths)
            try {
                BundleReader::probeInChild(path);
            } catch (const BundleError& e) {
                unreadable.emplace(path, e);
            }
    }
    return unreadable;
}

// Whether the command's input is a results file (read, not analysed: nothing to share) or it
// analyses a second capture unshared (report --against): then rank 0 runs it alone.
bool runsAlone(const std::vector<std::string>& args)
{
    for (std::size_t i = 1; i < args.size(); ++i) {
        std::error_code error;
        if (args[i] == "--against" || (!args[i].starts_with("-") && std::filesystem::is_regular_file(args[i], error) &&
                                       isResultsFile(args[i])))
            return true;
    }
    return false;
}

int runCommand(const std::vector<std::string>& args, const std::map<std::string, BundleError>& unreadable, bool alone,
               MpiShare& share)
{
    const bool root = share.rank() == 0;
    const std::string first = args.empty() ? "" : args[0];
    if (first.empty() || first == "--help" || first == "-h" || first == "help") {
        if (root) {
            std::cout << "kvscope-mpi: kvscope's commands in an MPI job; analyze, check and report share their\n"
                         "bundles' prompts over the ranks (mpirun -np N kvscope-mpi analyze DIR --json OUT)\n\n";
            printOverview(std::cout);
        }
        return first.empty() ? 2 : 0;
    }
    if (first == "--version") {
        if (root)
            std::cout << "kvscope-mpi " << kVersion << "\n";
        return 0;
    }
    const Command* command = findCommand(first);
    if (!command) {
        if (root)
            std::cerr << "kvscope-mpi: '" << first << "' is not a command (kvscope-mpi --help)\n";
        return 2;
    }
    const Args rest(args.begin() + 1, args.end());
    if (rest.size() == 1 && (rest[0] == "--help" || rest[0] == "-h")) {
        if (root)
            printUsage(first, std::cout);
        return 0;
    }
    const bool shared = kShared.count(first) > 0 && !alone;
    if (!shared && !root)
        return 0;  // one rank is enough
    // Every rank probed the bundles itself: they must agree (nodes that see different files
    // would share out different prompts).
    std::vector<double> counted{double(unreadable.size())}, low = counted, high = counted;
    if (shared) {
        MPI_Allreduce(MPI_IN_PLACE, low.data(), 1, MPI_DOUBLE, MPI_MIN, MPI_COMM_WORLD);
        MPI_Allreduce(MPI_IN_PLACE, high.data(), 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
        if (low != high) {
            if (root)
                std::cerr << "kvscope-mpi: the ranks do not agree on which bundles can be read (a file system that differs "
                             "between nodes?)\n";
            return 2;
        }
    }
    // What the probes found: a sweep leaves such a bundle out; one bundle alone is not opened
    // (the commands ask, under a share, before opening it).
    setBundleProbe([unreadable](const std::string& path) {
        if (const auto found = unreadable.find(path); found != unreadable.end())
            throw found->second;
    });
    const RunCommand run = command->run ? command->run : appCommand(first);
    if (shared)
        setSharedAnalysis(&share);
    // Every rank runs the command; only rank 0's output is the command's (the others would
    // repeat it). Another rank's errors are shown when it stops the job.
    std::ostringstream discarded, errors;
    std::ostream& out = root ? std::cout : discarded;
    std::ostream& err = root ? std::cerr : errors;
    int code = 2;
    try {
        code = run(rest, out, err);
    } catch (const AnalysisHandedOver&) {
        code = 0;  // this rank's prompts are rank 0's now
    } catch (const std::exception& e) {
        err << "kvscope: " << e.what() << "\n";
    }
    if (root && std::getenv("KVSCOPE_MPI_STATS") && !share.traffic().promptBytes.empty()) {
        const MpiShare::Traffic& t = share.traffic();
        std::cerr << "kvscope-mpi: " << share.size() << " rank(s); prompt bytes per rank:";
        for (std::uint64_t b : t.promptBytes)
            std::cerr << " " << b;
        std::cerr << "; each rank reduced " << t.reduced << " bytes in " << t.reductions << " MPI_Allreduce calls; rank 0 gathered "
                  << t.gathered << " bytes of results\n";
    }
    // A rank that failed before its part was gathered (before the prompts were even shared out,
    // or in the middle) would leave the others waiting for ever: it stops the job.
    if (shared && share.size() > 1 && code != 0 && !share.gathered()) {
        std::cerr << "kvscope-mpi: rank " << share.rank() << " stopped the job" << (root ? "\n" : ": " + errors.str());
        std::cerr.flush();
        MPI_Abort(MPI_COMM_WORLD, code);
    }
    return code;
}

}  // namespace

int main(int argc, char** argv)
{
    const std::vector<std::string> args(argv + 1, argv + argc);
    const std::map<std::string, BundleError> unreadable = probeBundles(args);
    const bool alone = runsAlone(args);
    int provided = 0;
    // Only the thread that runs the command calls MPI (the analysis's helpers never do).
    MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
    int code = 2;
    {
        MpiShare share(MPI_COMM_WORLD);
        code = runCommand(args, unreadable, alone, share);
    }
    MPI_Finalize();
    return code;
}
