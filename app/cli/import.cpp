#include "cli/commands.h"

#include "import/import_process.h"

#include <ostream>

namespace kvscope::cli {

int importDumps(const Args& args, std::ostream& out, std::ostream& err)
{
    std::string dir, bundle;
    for (std::size_t i = 0; i < args.size(); ++i) {
        if ((args[i] == "-o" || args[i] == "--output") && i + 1 < args.size())
            bundle = args[++i];
        else if (dir.empty() && !args[i].starts_with("-"))
            dir = args[i];
        else
            dir.clear(), i = args.size();
    }
    if (dir.empty() || bundle.empty()) {
        printUsage("import", err);
        return 2;
    }
    try {
        runImport(dir, bundle);  // in kvscope-import, the one executable that links libtorch
    } catch (const std::exception& e) {
        err << "kvscope: " << e.what() << "\n";
        return 2;
    }
    out << "wrote " << bundle << "\n";
    return 0;
}

}  // namespace kvscope::cli
