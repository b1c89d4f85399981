#include "format/output_path.h"

#include "format/bundle_error.h"

#include <filesystem>

#include <unistd.h>

namespace kvscope {

void requireWritableOutput(const std::string& output, const std::vector<std::string>& inputs)
{
    namespace fs = std::filesystem;
    std::error_code ec;
    if (fs::is_directory(output, ec))
        throw BundleError(output, {}, "is a folder: name a file to write");
    for (const std::string& input : inputs)
        if (fs::equivalent(output, input, ec))
            throw BundleError(output, {}, (input == output ? std::string("is the input itself")
                                                           : "is the same file as the input " + input) +
                                              ": write the output elsewhere");
    if (fs::exists(output, ec)) {  // /dev/stdout, or a file to replace
        if (::access(output.c_str(), W_OK) != 0)
            throw BundleError(output, {}, "cannot be written: permission denied");
        return;
    }
    const fs::path folder = fs::path(output).parent_path().empty() ? fs::path(".") : fs::path(output).parent_path();
    if (!fs::is_directory(folder, ec))
        throw BundleError(output, {}, "cannot be written: the folder " + folder.string() + " does not exist");
    if (::access(folder.c_str(), W_OK) != 0)
        throw BundleError(output, {}, "cannot be written: the folder " + folder.string() + " is not writable");
}

}  // namespace kvscope
