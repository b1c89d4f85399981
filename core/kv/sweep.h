#pragma once
// A sweep: many capture bundles of one model (written by many engine workers) analysed as one.
// The bundles are given as files, or as folders whose *.h5 files are taken in name order. A
// bundle that cannot be read, or whose config differs from the first readable one's (but for
// its pool size, which each worker sizes to its memory), is left out with the reason; the
// others form one CaptureLoader whose prompts are named by bundle and id ("NAME/ID", NAME the
// file's name without .h5, or its path where two files share a name).

#include "kv/capture_loader.h"

#include <memory>
#include <string>
#include <vector>

namespace kvscope {

struct SweepBundle {
    std::string name;     // what its prompts' names start with
    std::string path;
    std::string problem;  // why it was left out; empty when it is part of the sweep
};

struct Sweep {
    std::string label;                            // the folder, or the first bundle "and N more"
    std::vector<SweepBundle> bundles;             // every bundle given, in order
    std::shared_ptr<const CaptureLoader> loader;  // the readable ones as one capture; null when none is
};

// Whether a command's operands are a sweep: more than one, or a folder.
bool isSweep(const std::vector<std::string>& operands);

// The operands with every folder replaced by its *.h5 files in name order. Throws BundleError
// for a folder holding none, or an operand that is neither a file nor a folder.
std::vector<std::string> sweepBundlePaths(const std::vector<std::string>& operands);

// `probeInChild`: each bundle's metadata is read first in a child process (BundleReader::
// probeInChild), so that a file that crashes libhdf5 is left out instead of ending the process.
Sweep openSweep(const std::vector<std::string>& operands, UnreadableBlockPolicy policy, bool probeInChild);

// Throws BundleError naming every bundle left out of `sweep` and why (--strict).
void requireEveryBundle(const Sweep& sweep);

// Why `other` cannot be analysed with `first` (empty when it can): the configs must agree in
// everything but the number of blocks.
std::string sweepConfigMismatch(const KvCacheConfig& first, const KvCacheConfig& other);

}  // namespace kvscope
