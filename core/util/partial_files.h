#pragma once
// Files being written under a temporary name (a results file's RUN.kvres.partial): a process
// stopped by Ctrl+C, kill or a job scheduler must not leave them behind, and must not finish
// them either. The writer registers the file while it writes; the command's process installs
// the handler that removes what is registered and then dies of the signal as it would have.

#include <string>

namespace kvscope {

void registerPartialFile(const std::string& path);
void unregisterPartialFile(const std::string& path);

// SIGINT, SIGTERM and SIGHUP remove every registered file, then end the process by that signal
// (those the process was started ignoring stay ignored).
void removePartialFilesOnTermination();

}  // namespace kvscope
