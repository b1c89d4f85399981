#pragma once
// libhdf5 trusts the sizes and addresses it reads from a file's metadata: some corrupt files
// crash it (a segmentation fault inside the library) before any check of ours can run. The
// commands that read bundles therefore run in a forked child; when the child dies by a
// signal, the parent says so, names the file, and exits 2, as for any other bad input. Before
// that, the file's metadata is read in a probe child that is stopped after a minute (libhdf5
// can also loop for ever on corrupt metadata).

#include <functional>
#include <iosfwd>
#include <string>

namespace kvscope::cli {

// Runs `command` in a child process (fork, before anything else is set up) and returns its
// exit code; `input` names what it reads, for the message when the child crashes.
int runGuarded(const std::function<int()>& command, const std::string& input, std::ostream& err);

}  // namespace kvscope::cli
