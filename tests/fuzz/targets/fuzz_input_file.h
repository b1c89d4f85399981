#pragma once
// The readers under test take a path, as the app hands them one: each input is written to a
// file of this process's own (in /dev/shm when there is one, so no disk is touched).

#include <cstdint>
#include <cstdio>
#include <string>
#include <unistd.h>

namespace kvscope::fuzz {

inline std::string writeInput(const std::uint8_t* data, std::size_t size, const char* suffix)
{
    static const std::string dir = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
    const std::string path = dir + "/kvscope-fuzz-" + std::to_string(getpid()) + suffix;
    if (std::FILE* f = std::fopen(path.c_str(), "wb")) {
        if (size > 0)
            std::fwrite(data, 1, size, f);
        std::fclose(f);
    }
    return path;
}

}  // namespace kvscope::fuzz
