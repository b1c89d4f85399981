#pragma once
// A sweep: many capture bundles of one model (written by many engine workers) analysed as one.
// The bundles are given as files, or as folders whose *.h5 files are taken in name order. A
// bundle that cannot be read, or whose model, RoPE settings or config differ from the first
// readable one's (but for its pool size, which each worker sizes to its memory), is left out
// with the reason; the
// others form one CaptureLoader whose prompts are named by bundle and id ("NAME/ID", NAME the
// file's name without .h5, or its path where two files share a name).

#include "kv/capture_loader.h"

#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace kvscope {

struct SweepBundle {
    std::string name;     // what its prompts' names start with
    std::string path;
    std::string problem;  // why it was left out; empty when it is part of the sweep
    std::string created{};  // when it was captured (its metadata's ISO 8601 time; empty: not recorded)
};

struct Sweep {
    std::string label;                            // the folder, or the first bundle "and N more"
    std::vector<SweepBundle> bundles;             // every bundle given, in order
    std::shared_ptr<const CaptureLoader> loader;  // the readable ones as one capture; null when none is
};

// Whether a command's operands are a sweep: more than one, or a folder.
bool isSweep(const std::vector<std::string>& operands);

// The operands with every folder replaced by its *.h5 files in name order. Throws BundleError
// for a folder holding none, an operand that is neither a file nor a folder, or a file given
// twice.
std::vector<std::string> sweepBundlePaths(const std::vector<std::string>& operands);

// What is done with each bundle before it is opened; it throws BundleError for one that must not
// be: BundleReader::probeInChild (its metadata read in a child process, so that a file that
// crashes libhdf5 is left out instead of ending the process), or a lookup of probes made earlier
// (kvscope-mpi probes before MPI starts). Null: none.
using BundleProbe = std::function<void(const std::string& path)>;
Sweep openSweep(const std::vector<std::string>& operands, UnreadableBlockPolicy policy, const BundleProbe& probe);

// Throws BundleError naming every bundle left out of `sweep` and why (--strict).
void requireEveryBundle(const Sweep& sweep);

// Why `other` cannot be analysed with `first` (empty when it can): the same model and RoPE
// settings (metadata), configs that agree in everything but the number of blocks.
std::string sweepMismatch(const BundleReader& first, const BundleReader& other);
std::string sweepConfigMismatch(const KvCacheConfig& first, const KvCacheConfig& other);

}  // namespace kvscope
