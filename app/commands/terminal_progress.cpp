#include "commands/terminal_progress.h"

#include <cstdio>
#include <iostream>

#include <unistd.h>

namespace kvscope::cli {

TerminalProgress::TerminalProgress(std::ostream& err, std::string what)
    : m_err(err)
    , m_what(std::move(what))
    , m_shown(&err == &std::cerr && isatty(STDERR_FILENO) == 1)
{
}

void TerminalProgress::clear()
{
    const std::lock_guard lock(m_mutex);
    if (m_written)
        m_err << "\r\033[K" << std::flush;
    m_written = false;
    m_shown = false;  // (a late update must not bring it back over the results)
}

void TerminalProgress::update(int done, int total)
{
    const std::lock_guard lock(m_mutex);
    if (!m_shown || total <= 0)
        return;
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - m_start).count();
    std::string line = m_what + " " + std::to_string(done) + " of " + std::to_string(total) + " layers";
    if (done > 0 && done < total) {  // (the first layers include opening the bundle: an overestimate, soon corrected)
        const long left = long(seconds / done * (total - done) + 0.5);
        line += left >= 120 ? ", about " + std::to_string(left / 60) + " min left" : ", about " + std::to_string(left) + " s left";
    }
    m_err << "\r\033[K" << line << std::flush;
    m_written = true;
}

}  // namespace kvscope::cli
