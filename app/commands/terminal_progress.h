#pragma once
// Progress of a long command on standard error, when standard error is a terminal a person
// watches ("analysed 12 of 80 layers, about 40 s left"), rewritten in place; nothing when it is
// a file or a pipe, whose readers want the results alone.

#include <chrono>
#include <mutex>
#include <ostream>
#include <string>

namespace kvscope::cli {

class TerminalProgress {
public:
    // `err`: the command's error stream; shown only when it is std::cerr on a terminal.
    TerminalProgress(std::ostream& err, std::string what);
    ~TerminalProgress() { clear(); }
    bool shown() const { return m_shown; }
    // Takes the line away (before the results are printed to the same terminal).
    void clear();
    // From any thread: `done` of `total` (layers) finished.
    void update(int done, int total);

private:
    std::ostream& m_err;
    std::string m_what;
    bool m_shown;
    bool m_written = false;
    std::mutex m_mutex;
    std::chrono::steady_clock::time_point m_start = std::chrono::steady_clock::now();
};

}  // namespace kvscope::cli
