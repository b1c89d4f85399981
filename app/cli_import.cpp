#include "cli_import.h"

#include "dump_import.h"

#include <iostream>

namespace kvscope::cli {

int importDumps(const std::vector<std::string>& args)
{
    std::string dir, out;
    for (std::size_t i = 0; i < args.size(); ++i) {
        if ((args[i] == "-o" || args[i] == "--output") && i + 1 < args.size())
            out = args[++i];
        else if (dir.empty())
            dir = args[i];
        else
            dir.clear(), i = args.size();
    }
    if (dir.empty() || out.empty()) {
        std::cerr << "usage: kvscope import DIR -o BUNDLE.h5   (the expected files: docs/import.md)\n";
        return 2;
    }
    try {
        importDumpDirectory(dir, out);
    } catch (const std::exception& e) {
        std::cerr << "kvscope: " << e.what() << "\n";
        return 2;
    }
    std::cout << "wrote " << out << "\n";
    return 0;
}

}  // namespace kvscope::cli
